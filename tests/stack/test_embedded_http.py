"""The embedded default end to end: a job spec submitted over HTTP to the API on SQLite, picked up through
Celery's filesystem transport by a local worker, trained, and reported — with nothing else running."""

from __future__ import annotations

import json

import httpx
import pytest

from worker.embedded import embedded_stack, run_job_over_http

SPEC = {
    "model": {"name": "tiny-arith"},
    "task": {"source": "arithmetic", "train_size": 64, "eval_size": 8},
    "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
    "sampling": {"group_size": 4, "max_new_tokens": 5},
    "optim": {"steps": 4, "prompts_per_step": 3, "micro_batch_size": 6},
    "checkpoint": {"interval": 2},
}


@pytest.mark.slow
def test_embedded_stack_runs_a_job_over_http(tmp_path, monkeypatch):
    monkeypatch.delenv("STARE_DATABASE_URL", raising=False)
    home = tmp_path / "home"
    with embedded_stack(home) as (base, key):
        job = run_job_over_http(base, key, SPEC, home / "out", timeout_s=300)
        assert job["status"] == "succeeded", job
        headers = {"Authorization": f"Bearer {key}"}
        metrics = httpx.get(f"{base}/v1/jobs/{job['id']}/metrics", headers=headers, timeout=10).json()
        rows = metrics["data"]
        assert [row["step"] for row in rows] == [1, 2, 3, 4]
        assert all(row["values"]["entropy/mean"] is not None for row in rows)
    assert (home / "stare.db").is_file()
    assert not any((home / "broker" / "queue").iterdir())  # the message was consumed
    report = json.loads((home / "out" / "report.json").read_text())
    assert report["evaluation"]["before"]["step"] == 0 and report["evaluation"]["after"]["step"] == 4
    assert "<svg" in (home / "out" / "report.html").read_text()
    assert len(job["checkpoints"]) >= 2
