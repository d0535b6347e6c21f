"""A STARE job with rollout.engine vllm, submitted over HTTP to the embedded stack (API on SQLite, Celery's
filesystem transport, one local worker): the worker runs its trainer with vLLM's interpreter
(STARE_VLLM_PYTHON), the job succeeds, every step carries the rollout mismatch metrics, and the
evaluations before and after training ran (on the vLLM engine)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import requires_vllm_python, vllm_python
from worker.embedded import embedded_stack, run_job_over_http

SPEC = {
    "model": {"name": "tiny-arith"},
    "task": {"source": "arithmetic", "train_size": 64, "eval_size": 16},
    "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
    "algorithm": {"name": "stare"},
    "rollout": {"engine": "vllm", "tis_cap": 2.0},
    "sampling": {"group_size": 4, "max_new_tokens": 5},
    "optim": {"steps": 3, "prompts_per_step": 3, "micro_batch_size": 6},
    "sft": {"steps": 60, "lr": 3e-3, "batch_size": 32},
    "checkpoint": {"interval": 100},
}


@pytest.mark.slow
@requires_vllm_python()
def test_a_vllm_job_runs_over_http(tmp_path, monkeypatch):
    monkeypatch.delenv("STARE_DATABASE_URL", raising=False)
    monkeypatch.setenv("STARE_VLLM_PYTHON", vllm_python())
    home = tmp_path / "home"
    with embedded_stack(home) as (base, key):
        job = run_job_over_http(base, key, SPEC, home / "out", timeout_s=540)
        assert job["status"] == "succeeded", job
        headers = {"Authorization": f"Bearer {key}"}
        rows = httpx.get(f"{base}/v1/jobs/{job['id']}/metrics", headers=headers, timeout=10).json()["data"]
    assert [row["step"] for row in rows] == [1, 2, 3]
    for row in rows:
        values = row["values"]
        assert 0.0 <= values["rollout/mismatch_abs_max"] < 1e-2, values
        assert values["rollout/tis_capped_fraction"] == 0.0
    report = json.loads((home / "out" / "report.json").read_text())
    assert report["evaluation"]["after"]["step"] == 3
