"""Reliability 3 and 4: the broker and the database go away under running and queued jobs.

3. Redis flushed (every message lost) and restarted while one job runs and one is queued: both still end
   succeeded. The broker is a doorbell: the sweeper re-sends queued jobs nobody claimed, the worker reconnects.
4. PostgreSQL restarted while a job runs (down for longer than the stale-heartbeat threshold): the worker
   rides it out (its writes wait and retry with backoff, the trainer keeps going, the sweeper does not mistake
   the silence for a lost worker), nothing it had to write is lost, and the job ends succeeded in its first
   attempt.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

import psutil
import pytest

from tests.conftest import skip_missing_component
from tests.worker.harness import (
    STALE_AFTER_S,
    Harness,
    Infra,
    assert_steps_exactly_once,
    event_time,
    record_figures,
    tiny_spec,
)

pytestmark = pytest.mark.slow  # real servers, workers and trainers: the suite takes minutes


def _json_safe(value: Any) -> Any:
    """What the database keeps of a metric value (non-finite floats become null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def test_redis_flushed_and_restarted_with_jobs_queued_and_running(infra: Infra, harness: Harness) -> None:
    if infra.redis is None:
        skip_missing_component("no private redis-server here: will not flush and restart the shared one")
    h = harness
    worker = h.start_worker()
    running = h.post_job(tiny_spec(6, 2))
    h.wait_status(running, "running", timeout=60)
    queued = h.post_job(tiny_spec(4, 2))
    h.wait_step(running, 2, timeout=120)
    assert h.job_row(queued)["status"] == "queued", h.diagnostics()
    depth_before = int(infra.redis.client().llen(h.queue))

    down_at = time.time()
    infra.redis.stop(flush=True)  # FLUSHALL, then shut down: the queued job's message is gone
    time.sleep(3.0)
    infra.redis.start()
    up_at = time.time()

    h.wait_status(running, "succeeded", timeout=180)
    h.wait_status(queued, "succeeded", timeout=180)
    context = h.diagnostics()
    for job_id, steps in ((running, 6), (queued, 4)):
        row = h.job_row(job_id)
        assert row["attempt"] == 1, f"a broker outage costs no attempt\n{context}"
        assert_steps_exactly_once(h.metric_rows(job_id), steps, context)
    assert worker.alive(), context

    running_done = next(e for e in h.events(running) if e["type"] == "job.succeeded")
    queued_claim = next(e for e in h.events(queued) if e["type"] == "job.running")
    log = worker.log()
    record_figures(
        "test_redis_flushed_and_restarted_with_jobs_queued_and_running",
        redis_down_s=round(up_at - down_at, 2),
        messages_lost_in_flush=depth_before,
        queued_job_claimed_after_running_finished_s=round(
            event_time(queued_claim) - event_time(running_done), 2
        ),
        redis_back_to_queued_claim_s=round(event_time(queued_claim) - up_at, 2),
        duplicate_doorbells_dropped=log.count(f"job {queued} not claimable"),
        resends_logged=len(re.findall(r"sweep: \{[^}]*'resent': [1-9]", log)),
    )


def test_postgres_restarted_while_job_runs(infra: Infra, harness: Harness) -> None:
    if infra.postgres is None:
        skip_missing_component("no private PostgreSQL cluster here: will not restart the shared server")
    h = harness
    steps = 10
    worker = h.start_worker()
    job_id = h.post_job(tiny_spec(steps, 2))
    h.wait_step(job_id, 3, timeout=150)
    step_at_outage = h.max_step(job_id)

    down_at = time.time()
    infra.postgres.stop("fast")  # every connection is cut
    time.sleep(STALE_AFTER_S + 1.5)  # longer than the sweeper's "worker lost" threshold
    infra.postgres.start()
    up_at = time.time()
    outage = up_at - down_at
    assert outage > STALE_AFTER_S

    def beat_after_restart() -> bool:
        beat = h.job_row(job_id)["heartbeat_at"]
        return beat is not None and beat.timestamp() > up_at

    h.wait_for(
        "the worker's first heartbeat after the restart", beat_after_restart, timeout=60, job_id=job_id
    )
    heartbeat_back_s = time.time() - up_at

    h.wait_status(job_id, "succeeded", timeout=180)
    context = h.diagnostics(job_id)
    row = h.job_row(job_id)
    assert row["attempt"] == 1, f"the worker rode the restart out in its first attempt\n{context}"
    assert worker.alive(), context
    assert "database unavailable; retrying" in worker.log(), "the worker's writes waited and retried"

    # Nothing lost: every step and checkpoint the trainer reported is in the database, with its values.
    rows = h.metric_rows(job_id)
    assert_steps_exactly_once(rows, steps, context)
    trainer_events = h.trainer_events(job_id)
    trainer_steps = {e["step"]: e["metrics"] for e in trainer_events if e["type"] == "step"}
    assert sorted(trainer_steps) == list(range(1, steps + 1)), context
    for step, _, metrics in rows:
        assert metrics == {k: _json_safe(v) for k, v in trainer_steps[step].items()}, f"step {step}"
    trainer_checkpoints = sorted(e["step"] for e in trainer_events if e["type"] == "checkpoint")
    pruned = {e["step"] for e in trainer_events if e["type"] == "checkpoint_deleted"}  # keep_last
    kept = [step for step in trainer_checkpoints if step not in pruned]
    assert sorted(c["step"] for c in h.checkpoints(job_id)) == kept, context
    events = h.events(job_id)
    assert [e["id"] for e in events] == list(range(1, len(events) + 1)), "event ids have no gaps"
    created = sorted(e["data"]["step"] for e in events if e["type"] == "checkpoint.created")
    assert created == trainer_checkpoints, f"one checkpoint.created event per checkpoint\n{context}"
    assert [e["type"] for e in events].count("job.succeeded") == 1

    record_figures(
        "test_postgres_restarted_while_job_runs",
        postgres_down_s=round(outage, 2),
        step_at_outage=step_at_outage,
        heartbeat_back_after_restart_s=round(heartbeat_back_s, 2),
        retries_logged=worker.log().count("database unavailable; retrying"),
        attempts=row["attempt"],
    )


def test_worker_lost_during_database_outage_resumes_from_recorded_checkpoint(
    infra: Infra, harness: Harness
) -> None:
    """The worker dies while PostgreSQL is down, after its trainer wrote checkpoints the worker could not
    record yet. "Latest checkpoint" is the latest row: the next attempt must resume from it, not from a newer
    folder on disk whose steps have no metric rows (that would leave a gap in the history)."""
    if infra.postgres is None:
        skip_missing_component("no private PostgreSQL cluster here: will not stop the shared server")
    h = harness
    steps, interval = 8, 2
    worker = h.start_worker()
    # keep_last: the folder of the recorded checkpoint must survive the trainer running ahead.
    job_id = h.post_job(tiny_spec(steps, interval, checkpoint={"interval": interval, "keep_last": 20}))
    h.wait_step(job_id, 3, timeout=150)
    h.run_dir(job_id)
    infra.postgres.stop("fast")

    def newest_checkpoint_on_disk() -> int:
        return max((e["step"] for e in h.trainer_events(job_id) if e["type"] == "checkpoint"), default=0)

    try:  # the trainer runs on while the worker's writes wait; the worker dies with checkpoints unrecorded
        h.wait_for(
            "the trainer to checkpoint while the database is down",
            lambda: newest_checkpoint_on_disk() >= 6,
            timeout=120,
        )
        trainers = worker.kill9()
        psutil.wait_procs(trainers, timeout=15)
        ahead = newest_checkpoint_on_disk()
        completed = max(e["step"] for e in h.trainer_events(job_id) if e["type"] == "step")
    finally:
        infra.postgres.start()
    rows_at_kill = [s for s, _, _ in h.metric_rows(job_id)]
    recorded_checkpoint = max(c["step"] for c in h.checkpoints(job_id))
    assert ahead > recorded_checkpoint, "the trainer got ahead of what the worker recorded"

    h.start_worker()  # its sweeper finds the stale heartbeat, re-sends; it claims and resumes
    h.wait_status(job_id, "succeeded", timeout=240)
    context = h.diagnostics(job_id)
    events = h.events(job_id)
    running = [e for e in events if e["type"] == "job.running"]
    resumed = [e for e in events if e["type"] == "trainer.resumed"]
    assert [e["data"]["resume_step"] for e in running] == [None, recorded_checkpoint], context
    assert [e["data"]["step"] for e in resumed] == [recorded_checkpoint], (
        f"resumed from the latest recorded checkpoint ({recorded_checkpoint}), not the newest folder ({ahead})"
        f"\n{context}"
    )
    assert_steps_exactly_once(h.metric_rows(job_id), steps, context)
    record_figures(
        "test_worker_lost_during_database_outage_resumes_from_recorded_checkpoint",
        metric_rows_at_kill=max(rows_at_kill),
        recorded_checkpoint=recorded_checkpoint,
        newest_folder_at_kill=ahead,
        trainer_completed_step=completed,
    )
