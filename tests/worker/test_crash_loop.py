"""Reliability 7 (issue 12): a trainer that crashes at the same step in every attempt stops the job after
two attempts with `crash_loop`, the step and the trainer's own last error lines in the message, instead of
spending every attempt (and every later message) on the same traceback."""

from __future__ import annotations

import time

import pytest

from tests.worker.harness import Harness, event_time, record_figures, tiny_spec

pytestmark = pytest.mark.slow  # real servers, workers and trainers: the suite takes minutes

CRASH_STEP = 3
INTERVAL = 2
INJECTED = f"RuntimeError: injected crash at step {CRASH_STEP} (STARE_INJECT_CRASH_STEP)"


def test_a_crash_at_the_same_step_fails_the_job_after_two_attempts(harness: Harness) -> None:
    h = harness
    worker = h.start_worker(env={"STARE_INJECT_CRASH_STEP": str(CRASH_STEP)})
    posted = time.time()
    job_id = h.post_job(tiny_spec(8, INTERVAL))
    h.wait_status(job_id, ("failed", "succeeded", "cancelled"), timeout=240)
    context = h.diagnostics(job_id)

    job = h.job(job_id)
    assert job["status"] == "failed", context
    error = job["error"]
    assert (error["code"], error["category"]) == ("crash_loop", "system"), context
    message = error["message"]
    resumed = CRASH_STEP - 1
    assert message.startswith(
        f"the trainer failed 2 times in a row and the last attempt completed no step: it resumed from step "
        f"{resumed} and failed before finishing step {CRASH_STEP} (the furthest step any attempt reached: "
        f"{resumed})"
    ), message
    assert INJECTED in message, f"the trainer's last error lines are quoted\n{message}"
    assert (job["attempt"], job["failures"], job["lost_workers"]) == (2, 2, 0), context

    events = h.events(job_id)
    kinds = [e["type"] for e in events]
    assert kinds.count("job.running") == 2 and kinds.count("job.recovering") == 1, context
    recovering = next(e for e in events if e["type"] == "job.recovering")
    assert recovering["data"]["error"]["code"] == "trainer_crashed", recovering
    assert recovering["message"].startswith("trainer exited with code 1: "), recovering
    assert INJECTED in recovering["message"], recovering
    second = [e for e in events if e["type"] == "job.running"][1]
    assert second["data"]["resume_step"] == CRASH_STEP - CRASH_STEP % INTERVAL, context
    failed = [e for e in events if e["type"] == "job.failed"]
    assert len(failed) == 1 and failed[0]["data"]["error"]["code"] == "crash_loop", context

    rows = h.metric_rows(job_id)
    assert [(s, a) for s, a, _ in rows] == [(1, 1), (2, 1)], f"nothing after the crash step\n{context}"
    logs = h.trainer_logs(job_id)
    assert sorted(logs) == ["trainer-attempt-1.log", "trainer-attempt-2.log"], context
    assert all(INJECTED in text for text in logs.values()), "the stderr copy still reaches the log file"
    assert worker.alive() and len(h.workers) == 1

    record_figures(
        "test_a_crash_at_the_same_step_fails_the_job_after_two_attempts",
        crash_step=CRASH_STEP,
        attempts=job["attempt"],
        post_to_failed_s=round(event_time(failed[0]) - posted, 2),
        first_crash_to_failed_s=round(event_time(failed[0]) - event_time(recovering), 2),
        message=message[:200],
    )
