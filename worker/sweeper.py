"""The periodic repair pass that makes the broker a mere doorbell.

- Running (or pausing/cancelling) jobs whose heartbeat is older than stale_after_s: recovering (re-sent;
  they resume from their latest checkpoint) or failed (worker_lost) when the job's lost-worker budget is
  spent (lost_workers reaches max_lost_workers, 10 by default; a lost worker leaves the crash budget,
  failures/max_attempts, alone); pausing → paused, cancelling → cancelled. Not within stale_after_s of
  the database coming back after an outage (nobody could heartbeat during it).
- Queued/recovering jobs whose message is older than unclaimed_after_s (lost in a Redis restart, say): re-sent,
  but only as many per queue as the broker is short of: when the queue already holds a message for every
  job waiting on it (LLEN ≥ jobs waiting), the jobs are only waiting behind busy workers and get no second
  doorbell. Where the depth cannot be read (another broker, Redis down), every such job is re-sent.
Every change is a conditional UPDATE, so any number of sweepers may run at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from store import repository
from store.database import Database
from worker.broker import QueueDepth
from worker.settings import WorkerSettings
from worker.training import TRANSIENT_DB_ERRORS

logger = logging.getLogger(__name__)


def sweep_once(
    db: Database,
    settings: WorkerSettings,
    send: Callable[[str, str], None],
    *,
    recover_stale: bool = True,
    queue_depth: QueueDepth | None = None,
) -> dict[str, int]:
    recovered: list[tuple[str, str, str]] = []
    if recover_stale:
        with db.transaction() as session:
            recovered = repository.recover_stale_jobs(session, stale_after_s=settings.stale_after_s)
    with db.transaction() as session:
        unclaimed = repository.unclaimed_jobs(session, older_than_s=settings.unclaimed_after_s)
        recovering = {(job_id, queue) for job_id, queue, status in recovered if status == "recovering"}
        unclaimed = _missing_doorbells(session, unclaimed, recovering, queue_depth)
    to_send = recovering | set(unclaimed)
    sent = []
    for job_id, queue in sorted(to_send):
        try:
            send(job_id, queue)
            sent.append(job_id)
        except Exception:  # the broker may be down too; the next pass tries again
            logger.warning("could not re-send job %s", job_id, exc_info=True)
    if sent:
        with db.transaction() as session:
            repository.mark_enqueued(session, sent)
    return {"recovered": len(recovered), "resent": len(sent)}


def _missing_doorbells(
    session: Any,
    unclaimed: list[tuple[str, str]],
    recovering: set[tuple[str, str]],
    queue_depth: QueueDepth | None,
) -> list[tuple[str, str]]:
    """The unclaimed jobs to ring again: per queue, at most (jobs waiting − messages waiting − recovered
    jobs rung in this pass), oldest first; all of them where the queue's depth is unknown."""
    if queue_depth is None:
        return unclaimed
    by_queue: dict[str, list[tuple[str, str]]] = {}
    for job_id, queue in unclaimed:
        by_queue.setdefault(queue, []).append((job_id, queue))
    keep: list[tuple[str, str]] = []
    for queue, jobs in by_queue.items():
        depth = queue_depth(queue)
        if depth is None:
            keep.extend(jobs)
            continue
        rung_now = sum(1 for _, q in recovering if q == queue)
        missing = repository.count_waiting(session, queue) - depth - rung_now
        keep.extend(sorted(jobs)[: max(0, missing)])
    return keep


def sweep_forever(
    db: Database,
    settings: WorkerSettings,
    send: Callable[[str, str], None],
    stop: threading.Event,
    queue_depth: QueueDepth | None = None,
) -> None:
    # While the database is unreachable, no worker can write its heartbeat either: a stale heartbeat then says
    # nothing about the worker. After an outage, give every worker a full stale period to heartbeat again
    # before declaring any of them lost (else one restart of PostgreSQL would bounce every running job).
    db_was_down = False
    hold_recovery_until = 0.0
    while not stop.is_set():
        try:
            recover = not db_was_down and time.monotonic() >= hold_recovery_until
            counts = sweep_once(db, settings, send, recover_stale=recover, queue_depth=queue_depth)
            if db_was_down:
                db_was_down = False
                hold_recovery_until = time.monotonic() + settings.stale_after_s
            if counts["recovered"] or counts["resent"]:
                logger.info("sweep: %s", counts)
        except TRANSIENT_DB_ERRORS:
            db_was_down = True
            logger.warning("sweep skipped: database unavailable")
        except Exception:
            logger.exception("sweep failed")
        stop.wait(settings.sweep_interval_s)
