"""Issue 46's acceptance, items 1 and 2, on the real embedded stack (API on SQLite, a local worker running
the trainer): a tiny-model job whose every response is cut at max_new_tokens shows the truncation warning
and sample completions in the job view, the report, `stare jobs get`, `stare report` and `stare jobs
events`; natural-language lines uploaded for tiny-arith (an 18-character tokenizer) get the
unknown-character warning, counted, at estimate and at submission."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from contract.catalog import MODEL_ALPHABETS, TINY_ARITH
from worker.embedded import embedded_stack

REPO_ROOT = Path(__file__).resolve().parents[2]

# One token per response: a random tiny model almost never samples EOS first, so (nearly) every response
# is cut; the warning needs half of them cut, 3 steps in a row.
CUT_SPEC: dict[str, Any] = {
    "model": {"name": "tiny-arith"},
    "task": {"source": "arithmetic", "train_size": 64, "eval_size": 8},
    "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
    "sampling": {"group_size": 4, "max_new_tokens": 1},
    "optim": {"steps": 4, "prompts_per_step": 3, "micro_batch_size": 6},
    "checkpoint": {"interval": 4},
}
WORDS = [
    {"prompt": f"Tom has {i} apples and buys 2 more. How many apples does he have?", "answer": str(i + 2)}
    for i in range(20)
]
LETTERS_SPEC: dict[str, Any] = {
    "model": {"name": "tiny-arith"},
    "task": {"source": "jsonl", "train_size": 0, "eval_size": 4},
    "optim": {"steps": 2, "prompts_per_step": 2, "micro_batch_size": 4},
}


def _stare(base: str, key: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARE_")}
    env.update({"PYTHONPATH": str(REPO_ROOT), "STARE_API_URL": base, "STARE_API_KEY": key, "COLUMNS": "200"})
    done = subprocess.run(
        [sys.executable, "-m", "stare_client.cli", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _finished(client: httpx.Client, job_id: str, timeout_s: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return dict(job)
        time.sleep(1)
    pytest.fail(f"job {job_id} did not finish in {timeout_s} s: {job}")


def _unknown(records: list[dict[str, str]]) -> int:
    alphabet = set(MODEL_ALPHABETS[TINY_ARITH])
    return sum(ch not in alphabet for r in records for text in (r["prompt"], r["answer"]) for ch in text)


@pytest.mark.slow
def test_a_job_that_cuts_every_response_says_so_and_shows_its_samples(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.delenv("STARE_DATABASE_URL", raising=False)
    with embedded_stack(tmp_path / "home") as (base, key):
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
            _letters_on_tiny_arith_are_warned_of_at_estimate(client, tmp_path)
            created = client.post("/v1/jobs", json={"spec": CUT_SPEC})
            assert created.status_code == 201, created.text
            assert created.json()["warnings"] == []  # nothing to say before it runs
            job = _finished(client, created.json()["id"])
            assert job["status"] == "succeeded", job

            # The job view: the warning (once, with its steps) and the samples, every one cut.
            warnings = {w["kind"]: w for w in job["warnings"]}
            cut = warnings["truncated_responses"]
            assert (cut["first_step"], cut["step"], cut["count"]) == (3, 4, 2), cut
            assert "sampling.max_new_tokens" in cut["message"] and "raise" in cut["message"], cut
            evaluation, training = job["samples"]["eval"], job["samples"]["train"]
            assert evaluation["step"] == 4 and len(evaluation["samples"]) == 4, evaluation
            assert training["step"] == 1 and len(training["samples"]) == 2, training
            for sample in evaluation["samples"] + training["samples"]:
                assert sample["prompt"].endswith("=") and sample["reference"].lstrip("-").isdigit(), sample
                assert isinstance(sample["completion"], str) and isinstance(sample["reward"], float)
            assert sum(s["truncated"] for s in evaluation["samples"]) >= 3, evaluation

            # The report, JSON and HTML.
            report = client.get(f"/v1/jobs/{job['id']}/report").json()
            assert [w["kind"] for w in report["warnings"]].count("truncated_responses") == 1, report[
                "warnings"
            ]
            assert (
                report["samples"]["eval_first"]["step"] == 0 and report["samples"]["eval_last"]["step"] == 4
            )
            assert report["samples"]["eval_last"]["samples"] == evaluation["samples"]
            page = client.get(f"/v1/jobs/{job['id']}/report", params={"format": "html"}).text
            assert "Sample completions" in page and "truncated_responses" in page

            # The event stream: steps, evaluations, samples and the warning.
            types = [
                e["type"]
                for e in client.get(f"/v1/jobs/{job['id']}/events", params={"limit": 200}).json()["data"]
            ]
            assert types.count("step.completed") == 4 and types.count("eval.completed") == 2, types
            assert types.count("samples.eval") == 2 and types.count("samples.train") == 1, types
            assert types.count("warning.truncated_responses") == 2, types

        # The CLI.
        shown = _stare(base, key, "jobs", "get", job["id"])
        assert "truncated_responses" in shown and "cut at max_new_tokens" in shown, shown
        assert "evaluation samples (step 4)" in shown and evaluation["samples"][0]["prompt"] in shown, shown
        reported = _stare(base, key, "report", job["id"])
        assert "truncated_responses" in reported and "evaluation (first) samples (step 0)" in reported, (
            reported
        )
        events = _stare(base, key, "jobs", "events", job["id"])
        assert "step.completed step 4" in events and "warning.truncated_responses step 3" in events, events
        lines = _stare(base, key, "jobs", "events", job["id"], "--follow", "-o", "json").splitlines()
        assert [json.loads(line)["type"] for line in lines] == types


def _letters_on_tiny_arith_are_warned_of_at_estimate(client: httpx.Client, tmp_path: Path) -> None:
    data = tmp_path / "words.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in WORDS))
    with data.open("rb") as fh:
        uploaded = client.post("/v1/files", data={"purpose": "rl_train"}, files={"file": ("words.jsonl", fh)})
    assert uploaded.status_code == 201, uploaded.text
    body = {"spec": LETTERS_SPEC, "training_file": uploaded.json()["id"]}
    estimate = client.post("/v1/jobs/estimate", json=body)
    assert estimate.status_code == 200, estimate.text
    [warning] = estimate.json()["warnings"]
    assert warning["kind"] == "unknown_characters", warning
    assert warning["count"] == _unknown(WORDS) > 0, (warning, _unknown(WORDS))
    assert f"{_unknown(WORDS)} characters in 20 records" in warning["message"], warning
    assert "pick a model" in warning["message"], warning
    created = client.post("/v1/jobs", json=body)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    assert [w["kind"] for w in created.json()["warnings"]] == ["unknown_characters"]
    client.post(f"/v1/jobs/{job_id}/cancel")
    again = client.get(f"/v1/jobs/{job_id}").json()
    assert [w["kind"] for w in again["warnings"]] == ["unknown_characters"], again["warnings"]
