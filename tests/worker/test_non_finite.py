"""Reliability 5: a job whose loss turns non-finite ends failed (user error: the job's own numbers, never
retried) with the step in its error, and its last checkpoint is still downloadable over HTTP."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from tests.worker.harness import Harness, record_figures, tiny_spec

pytestmark = pytest.mark.slow  # real servers, workers and trainers: the suite takes minutes

NAN_STEP = 3
INTERVAL = 2


def test_non_finite_loss_fails_as_user_error_and_keeps_its_checkpoint(harness: Harness) -> None:
    h = harness
    h.start_worker(env={"STARE_INJECT_NAN_STEP": str(NAN_STEP)})
    job_id = h.post_job(tiny_spec(6, INTERVAL))
    h.wait_status(job_id, ("failed", "succeeded", "cancelled"), timeout=180)
    context = h.diagnostics(job_id)

    job = h.job(job_id)
    assert job["status"] == "failed", context
    error = job["error"]
    assert error["category"] == "user", context
    assert error["code"] == "non_finite", context
    assert f"step {NAN_STEP}" in error["message"], context
    assert job["attempt"] == 1, f"a user error is never retried\n{context}"
    assert [s for s, _, _ in h.metric_rows(job_id)] == list(range(1, NAN_STEP)), context

    checkpoints = h.checkpoints(job_id)
    last = max(checkpoints, key=lambda c: c["step"])
    assert last["step"] == NAN_STEP - NAN_STEP % INTERVAL == 2, context
    response = h.api("GET", f"/v1/jobs/{job_id}/checkpoints/{last['id']}/download")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-tar")
    body = response.content
    assert hashlib.sha256(body).hexdigest() == response.headers["x-content-sha256"]
    assert int(response.headers["content-length"]) == len(body)
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        names = tar.getnames()
        assert all(n.split("/", 1)[0] == f"{job_id}-step-000002" for n in names), names
        files = {n.split("/", 1)[1] for n in names if "/" in n}
        assert {
            "model/config.json",
            "model/model.safetensors",
            "model/tokenizer.json",
            "state.json",
        } <= files, names
        state = tar.extractfile(f"{job_id}-step-000002/state.json")
        assert state is not None and b'"step": 2' in state.read()
    record_figures(
        "test_non_finite_loss_fails_as_user_error_and_keeps_its_checkpoint",
        nan_step=NAN_STEP,
        error=error["message"],
        last_checkpoint_step=last["step"],
        archive_bytes=len(body),
    )


def test_non_finite_loss_under_torchrun_fails_as_user_error(harness: Harness) -> None:
    """The same over 2 processes: torchrun exits 1 when its processes exit 3; the worker reads their code
    back from torchrun's error file (worker/supervisor.py), so the job is not taken for a crash and retried."""
    h = harness
    h.start_worker(env={"STARE_INJECT_NAN_STEP": str(NAN_STEP), "STARE_WORKER_PROCESSES_PER_NODE": "2"})
    job_id = h.post_job(tiny_spec(6, INTERVAL, distributed={"processes_per_node": 2}))
    h.wait_status(job_id, ("failed", "succeeded", "cancelled"), timeout=240)
    context = h.diagnostics(job_id)

    job = h.job(job_id)
    assert job["status"] == "failed", context
    error = job["error"]
    assert (error["category"], error["code"]) == ("user", "non_finite"), context
    assert f"step {NAN_STEP}" in error["message"], context
    assert job["attempt"] == 1, f"a user error is never retried\n{context}"
    assert [s for s, _, _ in h.metric_rows(job_id)] == list(range(1, NAN_STEP)), context
    report = json.loads((h.run_dir(job_id) / "trainer-attempt-1.error.json").read_text())
    assert report["message"]["errorCode"] == 3, report
