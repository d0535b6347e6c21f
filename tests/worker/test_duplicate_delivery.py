"""Reliability 2: the same job delivered twice, to two workers at once: exactly one runs it."""

from __future__ import annotations

import re
import time

import pytest

from tests.worker.harness import Harness, assert_steps_exactly_once, record_figures, tiny_spec

pytestmark = pytest.mark.slow  # real servers, workers and trainers: the suite takes minutes

STEPS = 4


def test_same_job_delivered_twice_to_two_workers_runs_once(harness: Harness) -> None:
    h = harness
    # No sweeper here: the only messages are the two this test sends.
    first = h.start_worker(sweep=False, wait_ready=False)
    second = h.start_worker(sweep=False, wait_ready=False)
    first.wait_ready()
    second.wait_ready()

    job_id = h.post_job(tiny_spec(STEPS, 2))  # the API rings once...
    h.send_duplicate(job_id)  # ...and the same message goes out again at once
    sent_at = time.monotonic()

    trainer_pids: set[int] = set()
    while h.job_row(job_id)["status"] not in ("succeeded", "failed", "cancelled"):
        for worker in (first, second):
            trainer_pids.update(p.pid for p in worker.trainers())
        if time.monotonic() - sent_at > 180:
            raise AssertionError(f"job did not finish in 180 s\n{h.diagnostics(job_id)}")
        time.sleep(0.1)
    context = h.diagnostics(job_id)

    row = h.job_row(job_id)
    assert row["status"] == "succeeded", context
    assert row["attempt"] == 1, f"exactly one claim\n{context}"
    assert len(trainer_pids) == 1, f"exactly one trainer process ran: {trainer_pids}\n{context}"
    events = h.events(job_id)
    assert [e["type"] for e in events].count("job.running") == 1, context
    assert sorted(h.trainer_logs(job_id)) == ["trainer-attempt-1.log"], context
    assert_steps_exactly_once(h.metric_rows(job_id), STEPS, context)

    # Both workers got a message for the job; one claimed it, the other dropped its copy.
    received = {
        w.name: len(re.findall(r"Task worker\.train_job\[[^\]]+\] received", w.log()))
        for w in (first, second)
    }
    assert received == {first.name: 1, second.name: 1}, f"one delivery to each worker: {received}\n{context}"
    claimed = [w.name for w in (first, second) if f"claimed job {job_id}" in w.log()]
    dropped = [w.name for w in (first, second) if f"job {job_id} not claimable" in w.log()]
    assert len(claimed) == 1 and len(dropped) == 1 and claimed != dropped, f"{claimed} {dropped}\n{context}"
    record_figures(
        "test_same_job_delivered_twice_to_two_workers_runs_once",
        deliveries=2,
        claims=1,
        trainer_processes=len(trainer_pids),
        attempts=row["attempt"],
    )
