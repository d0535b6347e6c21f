"""The periodic repair pass that makes the broker a mere doorbell.

- Running (or pausing/cancelling) jobs whose heartbeat is older than stale_after_s: recovering (re-sent;
  they resume from their latest checkpoint) or failed when attempts are used up; pausing → paused,
  cancelling → cancelled. Not within stale_after_s of the database coming back after an outage (nobody
  could heartbeat during it).
- Queued/recovering jobs whose message is older than unclaimed_after_s (lost in a Redis restart, say): re-sent.
Every change is a conditional UPDATE, so any number of sweepers may run at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from service import repository
from service.database import Database
from worker.settings import WorkerSettings
from worker.training import TRANSIENT_DB_ERRORS

logger = logging.getLogger(__name__)


def sweep_once(
    db: Database, settings: WorkerSettings, send: Callable[[str, str], None], *, recover_stale: bool = True
) -> dict[str, int]:
    recovered: list[tuple[str, str, str]] = []
    if recover_stale:
        with db.transaction() as session:
            recovered = repository.recover_stale_jobs(session, stale_after_s=settings.stale_after_s)
    with db.transaction() as session:
        unclaimed = repository.unclaimed_jobs(session, older_than_s=settings.unclaimed_after_s)
    to_send = {(job_id, queue) for job_id, queue, status in recovered if status == "recovering"}
    to_send |= set(unclaimed)
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


def sweep_forever(
    db: Database, settings: WorkerSettings, send: Callable[[str, str], None], stop: threading.Event
) -> None:
    # While the database is unreachable, no worker can write its heartbeat either: a stale heartbeat then says
    # nothing about the worker. After an outage, give every worker a full stale period to heartbeat again
    # before declaring any of them lost (else one restart of PostgreSQL would bounce every running job).
    db_was_down = False
    hold_recovery_until = 0.0
    while not stop.is_set():
        try:
            recover = not db_was_down and time.monotonic() >= hold_recovery_until
            counts = sweep_once(db, settings, send, recover_stale=recover)
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
