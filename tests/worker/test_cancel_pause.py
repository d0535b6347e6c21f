"""Reliability 6: cancel and pause/resume.

- Cancel of a running job is cooperative: the worker sees `cancelling` at its next heartbeat, the trainer
  finishes its step, writes a checkpoint at that step and exits; the job ends cancelled.
- Cancel of a queued job: it never starts (no claim, no trainer), even though its message is delivered.
- Cancel while the trainer loads its model (issue 46): the trainer stops at once, with nothing to save;
  the job is cancelled within 15 s of the request, with no step and no checkpoint.
- Pause of a running job: paused with a checkpoint at the step it stopped; resume continues from that
  checkpoint, and the resumed run is exact: its per-step metrics (except timings, perf/*) equal those of an
  uninterrupted run of the same spec and seed. Only the checkpoint it resumes from keeps its optimizer state
  while it is paused, and none once it has succeeded (worker/retention.py).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.worker.harness import (
    UNCLAIMED_AFTER_S,
    Harness,
    assert_steps_exactly_once,
    event_time,
    record_figures,
    tiny_spec,
)
from trainer.run.faults import LOAD_DELAY_ENV
from worker.supervisor import _catches

pytestmark = pytest.mark.slow  # real servers, workers and trainers: the suite takes minutes


def _no_timings(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if not k.startswith("perf/")}


def test_cancel_running_job_stops_at_a_checkpoint(harness: Harness) -> None:
    h = harness
    worker = h.start_worker()
    steps, interval = 40, 5
    job_id = h.post_job(tiny_spec(steps, interval))
    h.wait_step(job_id, 2, timeout=150)
    assert worker.trainers(), h.diagnostics(job_id)
    requested_at = time.time()
    response = h.api("POST", f"/v1/jobs/{job_id}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelling"
    step_at_request = h.max_step(job_id)
    h.wait_status(job_id, "cancelled", timeout=90)
    cancelled_after = time.time() - requested_at
    context = h.diagnostics(job_id)

    h.wait_for("the trainer to exit", lambda: not worker.trainers(), timeout=30, job_id=job_id)
    rows = h.metric_rows(job_id)
    stopped_at = rows[-1][0]
    assert stopped_at < steps, f"it stopped early\n{context}"
    assert_steps_exactly_once(rows, stopped_at, context)
    checkpoints = sorted(c["step"] for c in h.checkpoints(job_id))
    assert checkpoints[-1] == stopped_at, f"a checkpoint at the step it stopped at: {checkpoints}\n{context}"
    events = [e["type"] for e in h.events(job_id)]
    assert events.count("job.cancel_requested") == 1 and events[-1] == "job.cancelled", events
    row = h.job_row(job_id)
    assert row["attempt"] == 1 and row["failures"] == 0, context
    assert h.job(job_id)["error"] is None, context
    interrupted = [e for e in h.trainer_events(job_id) if e["type"] == "interrupted"]
    assert [e["step"] for e in interrupted] == [stopped_at], "the trainer stopped cooperatively"
    record_figures(
        "test_cancel_running_job_stops_at_a_checkpoint",
        step_at_request=step_at_request,
        stopped_at_step=stopped_at,
        checkpoint_interval=interval,
        request_to_cancelled_s=round(cancelled_after, 2),
    )


def test_cancel_while_the_model_loads_ends_within_15_s(harness: Harness) -> None:
    h = harness
    worker = h.start_worker(env={LOAD_DELAY_ENV: "600"})  # a model that takes ten minutes to load
    job_id = h.post_job(tiny_spec(4, 2))
    # Loading: the trainer is past its imports (its SIGTERM handler is installed) and in the load delay.
    h.wait_for(
        "the trainer to load its model",
        lambda: [p for p in worker.trainers() if _catches(p.pid, signal.SIGTERM)],
        timeout=120,
        job_id=job_id,
    )
    requested_at = time.time()
    response = h.api("POST", f"/v1/jobs/{job_id}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelling"
    h.wait_status(job_id, "cancelled", timeout=30)
    cancelled_after = time.time() - requested_at
    context = h.diagnostics(job_id)
    assert cancelled_after <= 15, f"cancelled {cancelled_after:.1f} s after the request\n{context}"
    h.wait_for("the trainer to exit", lambda: not worker.trainers(), timeout=30, job_id=job_id)
    assert h.metric_rows(job_id) == [] and h.checkpoints(job_id) == [], context
    assert h.job(job_id)["error"] is None, context
    assert [e["type"] for e in h.events(job_id)][-1] == "job.cancelled", context
    assert "started" not in [e["type"] for e in h.trainer_events(job_id)], "it never finished loading"
    record_figures(
        "test_cancel_while_the_model_loads_ends_within_15_s", request_to_cancelled_s=round(cancelled_after, 2)
    )


def _with_training_state(run_dir: Path) -> list[int]:
    """Steps of the run's checkpoints that still hold their optimizer state (sharded/)."""
    folders = sorted((run_dir / "checkpoints").glob("step-*"))
    return [int(f.name.removeprefix("step-")) for f in folders if (f / "sharded").is_dir()]


def test_cancel_queued_job_never_starts(harness: Harness) -> None:
    h = harness
    job_id = h.post_job(tiny_spec(4, 2))  # no worker yet: its message waits on the broker
    response = h.api("POST", f"/v1/jobs/{job_id}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelled"

    worker = h.start_worker()  # takes the message, and drops it
    h.wait_for(
        "the worker to drop the cancelled job's message",
        lambda: f"job {job_id} not claimable" in worker.log(),
        timeout=60,
        job_id=job_id,
    )
    time.sleep(UNCLAIMED_AFTER_S + 1)  # the sweeper does not re-send it either
    context = h.diagnostics(job_id)
    row = h.job_row(job_id)
    assert row["status"] == "cancelled" and row["attempt"] == 0, context
    assert f"claimed job {job_id}" not in worker.log(), context
    assert worker.log().count(f"job {job_id} not claimable") == 1, context
    assert [e["type"] for e in h.events(job_id)] == ["job.created", "job.cancelled"], context
    run_dir = h.run_dir(job_id)
    assert not run_dir.exists(), f"nothing was prepared for it\n{context}"
    assert h.metric_rows(job_id) == [] and h.checkpoints(job_id) == []


def test_pause_then_resume_continues_exactly(harness: Harness) -> None:
    h = harness
    steps, interval = 10, 4
    h.start_worker()
    h.start_worker(sweep=False)
    spec = tiny_spec(steps, interval)
    reference = h.post_job(spec)  # the uninterrupted run of the same spec (and seed)
    paused = h.post_job(spec)

    h.wait_step(paused, 2, timeout=150)
    requested_at = time.time()
    response = h.api("POST", f"/v1/jobs/{paused}/pause")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "pausing"
    h.wait_status(paused, "paused", timeout=90)
    paused_after = time.time() - requested_at
    context = h.diagnostics(paused)
    paused_at = h.max_step(paused)
    assert paused_at < steps, context
    assert max(c["step"] for c in h.checkpoints(paused)) == paused_at, f"paused with a checkpoint\n{context}"
    assert _with_training_state(h.run_dir(paused)) == [paused_at], context  # what the resume reads
    time.sleep(UNCLAIMED_AFTER_S + 1)
    assert h.job_row(paused)["status"] == "paused", "a paused job stays paused (the sweeper leaves it)"

    resumed_at = time.time()
    response = h.api("POST", f"/v1/jobs/{paused}/resume")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "queued"
    h.wait_status(paused, "succeeded", timeout=180)
    h.wait_status(reference, "succeeded", timeout=180)
    context = h.diagnostics()

    events = h.events(paused)
    running = [e for e in events if e["type"] == "job.running"]
    assert [e["data"]["resume_step"] for e in running] == [None, paused_at], context
    resumed = [e for e in events if e["type"] == "trainer.resumed"]
    assert [e["data"]["step"] for e in resumed] == [paused_at], context
    row = h.job_row(paused)
    assert row["attempt"] == 2 and row["failures"] == 0, context

    assert _with_training_state(h.run_dir(paused)) == [], context  # succeeded: model/ only
    assert all(
        (h.run_dir(paused) / "checkpoints" / f"step-{c['step']:06d}" / "model").is_dir()
        for c in h.checkpoints(paused)
    )
    rows = h.metric_rows(paused)
    assert_steps_exactly_once(rows, steps, context)
    assert [a for _, a, _ in rows] == [1] * paused_at + [2] * (steps - paused_at), context
    reference_rows = h.metric_rows(reference)
    assert_steps_exactly_once(reference_rows, steps, context)
    for (step, _, got), (_, _, want) in zip(rows, reference_rows):
        assert _no_timings(got) == _no_timings(want), f"step {step} differs from the uninterrupted run"
    record_figures(
        "test_pause_then_resume_continues_exactly",
        paused_at_step=paused_at,
        checkpoint_interval=interval,
        request_to_paused_s=round(paused_after, 2),
        resume_to_trainer_resumed_s=round(event_time(resumed[0]) - resumed_at, 2),
        metrics_compared=len(_no_timings(rows[0][2])) * steps,
    )
