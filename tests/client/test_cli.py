"""The `stare` command against the real service (tests/client/stack.py): one-line errors with documented
exit codes for bad input, `jobs watch` / `submit --watch` exit codes by outcome, and `-o json` on the
commands scripts use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from stare_client import Client
from stare_client.cli import Exit, main
from tests.client.conftest import Submitted
from tests.client.stack import REPO_ROOT, Stack, free_port, tiny_spec

pytestmark = pytest.mark.slow


def stare_env(stack: Stack, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARE_")}
    env.update(
        {
            "STARE_API_URL": stack.url,
            "STARE_API_KEY": stack.api_key,
            "PYTHONUNBUFFERED": "1",
            "COLUMNS": "200",
        }
    )
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(extra)
    return env


def stare(*args: str, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stare_client.cli", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_bad_input_is_one_line_naming_the_problem(stack: Stack, tmp_path: Path) -> None:
    env = stare_env(stack)
    (tmp_path / "broken.yaml").write_text("model: {name: tiny-arith\noptim: [1,\n")
    (tmp_path / "unknown.yaml").write_text(yaml.safe_dump(tiny_spec(2) | {"optim": {"steps": 2, "bogus": 1}}))
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(tiny_spec(2)))
    cases: dict[str, tuple[list[str], dict[str, str], int, list[str]]] = {
        "missing spec file": (
            ["jobs", "submit", "absent.yaml"],
            env,
            Exit.ERROR,
            ["absent.yaml", "not found"],
        ),
        "invalid YAML": (
            ["jobs", "submit", "broken.yaml"],
            env,
            Exit.ERROR,
            ["broken.yaml", "not valid YAML", "line"],
        ),
        "unknown field": (["jobs", "submit", "unknown.yaml"], env, Exit.ERROR, ["spec.optim.bogus"]),
        "wrong key": (
            ["jobs", "list"],
            stare_env(stack, STARE_API_KEY="sk-stare-wrong"),
            Exit.AUTH,
            ["invalid_api_key"],
        ),
        "unreachable server": (
            ["--url", f"http://127.0.0.1:{free_port()}", "jobs", "submit", "ok.yaml"],
            env,
            Exit.UNREACHABLE,
            ["cannot reach", "127.0.0.1"],
        ),
        "bad job id": (
            ["jobs", "get", "job_0000000000000000000000000"],
            env,
            Exit.ERROR,
            ["not_found", "job_id"],
        ),
        "unknown command": (["jobs", "frobnicate"], env, Exit.USAGE, ["frobnicate"]),
    }
    running = {name: stare(*args, env=e, cwd=tmp_path) for name, (args, e, _, _) in cases.items()}
    for name, proc in running.items():
        stdout, stderr = proc.communicate(timeout=60)
        _, _, code, words = cases[name]
        assert proc.returncode == code, (name, proc.returncode, stdout, stderr)
        assert "Traceback" not in stderr + stdout, (name, stderr)
        lines = [line for line in stderr.splitlines() if line.strip()]
        if name != "unknown command":  # click's usage error is its own short block
            assert len(lines) == 1 and lines[0].startswith("error: "), (name, stderr)
        for word in words:
            assert word in stderr, (name, word, stderr)
    with Client(stack.url, stack.api_key) as after:
        assert after.me().tenant.id == stack.tenant_id  # nothing above harmed the API


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code = main([*args, "-o", "json"])
    captured = capsys.readouterr()
    assert code == 0, (args, code, captured.err)
    return json.loads(captured.out)


def test_watch_exit_codes_and_json_output(
    stack: Stack,
    client: Client,
    submitted: Submitted,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = stare_env(stack)
    # submit --watch, then the job is cancelled from elsewhere: exit 11.
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(tiny_spec(50)))
    watcher = stare(
        "jobs", "submit", "spec.yaml", "--watch", "--idempotency-key", "cli-watch-1", env=env, cwd=tmp_path
    )
    assert watcher.stdout is not None
    first = watcher.stdout.readline()
    assert first.startswith("submitted job_"), first
    job_id = first.split()[1]
    client.jobs.cancel(job_id)
    stdout, stderr = watcher.communicate(timeout=120)
    assert watcher.returncode == Exit.JOB_CANCELLED, (stdout, stderr)
    assert f"{job_id}: cancelled" in stdout

    # A job whose trainer crashes: exit 10, with its error.
    broken = stare("jobs", "watch", submitted.broken, env=env, cwd=tmp_path)
    # The finished full job: exit 0, its final state on the last line.
    done = stare("jobs", "watch", submitted.full, env=env, cwd=tmp_path)
    stdout, stderr = broken.communicate(timeout=240)
    assert broken.returncode == Exit.JOB_FAILED, (stdout, stderr, stack.diagnostics())
    assert f"{submitted.broken}: failed" in stdout and "trainer_crashed" in stdout, stdout
    stdout, stderr = done.communicate(timeout=240)
    assert done.returncode == Exit.OK, (stdout, stderr)
    assert stdout.strip().splitlines()[-1] == f"{submitted.full}: succeeded"
    assert "step 4/4" in stdout  # the progress bar's last frame

    # -o json, in process (the same main() the entry point runs).
    monkeypatch.setenv("STARE_API_URL", stack.url)
    monkeypatch.setenv("STARE_API_KEY", stack.api_key)
    listed = run_json(capsys, "jobs", "list", "--status", "succeeded")
    assert submitted.full in {j["id"] for j in listed} and all(j["status"] == "succeeded" for j in listed)
    assert run_json(capsys, "jobs", "get", submitted.full)["progress"]["step"] == 4
    ckpts = run_json(capsys, "checkpoints", "list", submitted.full)
    assert [c["step"] for c in ckpts] == [2, 4]
    client.jobs.wait(submitted.lora, timeout=180)
    compared = run_json(capsys, "jobs", "compare", submitted.full, submitted.lora)
    assert compared[submitted.full]["status"] == "succeeded" and "avg@k after" in compared[submitted.lora]
    report = run_json(capsys, "report", submitted.full, "--html", str(tmp_path / "r.html"))
    assert report["job"]["id"] == submitted.full and "<svg" in (tmp_path / "r.html").read_text()
    got = run_json(capsys, "checkpoints", "download", submitted.full, "2", "--to", str(tmp_path / "ck"))
    assert got["step"] == 2 and got["kind"] == "model" and Path(got["path"], "config.json").is_file()
    only = run_json(
        capsys, "checkpoints", "download", submitted.full, "4", "--model-only", "--to", str(tmp_path / "m")
    )
    assert only["step"] == 4 and [p.name for p in (tmp_path / "m").iterdir()] == ["model"]
    assert run_json(capsys, "jobs", "get", submitted.full)["disk_bytes"] > 0

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    uploaded = run_json(capsys, "files", "upload", str(data))
    assert uploaded["records"] == 1
    assert uploaded["id"] in {f["id"] for f in run_json(capsys, "files", "list")}
    assert run_json(capsys, "files", "delete", uploaded["id"])["deleted"] is True

    key = run_json(capsys, "keys", "create", "--name", "cli")
    assert key["key"].startswith("sk-") and key["id"] in {k["id"] for k in run_json(capsys, "keys", "list")}
    assert run_json(capsys, "keys", "revoke", key["id"])["revoked_at"] is not None

    queued = client.jobs.create(tiny_spec(2))
    assert run_json(capsys, "jobs", "pause", queued.id)["status"] in ("paused", "pausing")
    assert run_json(capsys, "jobs", "cancel", queued.id)["status"] in ("cancelled", "cancelling")
    client.jobs.wait(queued, timeout=60)
    assert run_json(capsys, "jobs", "delete", queued.id)["deleted"] is True
    started = time.monotonic()
    assert main(["jobs", "watch", queued.id, "-o", "json"]) == Exit.ERROR  # gone: not_found
    assert "not_found" in capsys.readouterr().err and time.monotonic() - started < 10
