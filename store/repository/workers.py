"""The worker registry: workers advertise what they can run, beat, and leave; the service reads who is live.

A worker writes one row per queue it consumes (`register_worker`, at start and whenever its heartbeat finds
its row gone), renews `heartbeat_at` every beat (`worker_heartbeat`) and deletes its rows at a clean stop
(`remove_worker`). `live_workers` returns the rows that beat after a cutoff: a worker that stopped beating
(killed, host lost) stops counting once its last beat is older than the service's stale time, and
`forget_workers` deletes such rows (the sweeper's housekeeping). `live_queues` is the queues that some live
worker consumes, and `jobs_without_worker` counts the jobs that wait (queued, recovering) in a queue that
none serves: nothing will take them until a worker of that queue starts. Capabilities are stored as given
(the JSON of contract.fleet.WorkerClass); the store does not interpret them.

One clock: beats are written with the database's time and compared with it (`db_now`), never a host's, and
a beat dated in the future (a row written by a host whose clock ran ahead) does not count as live.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from store.models import WAITING_STATUSES, Job, Worker
from store.repository._common import db_now, rowcount, upsert

FUTURE_SLACK = timedelta(seconds=1)  # a beat later than the database's now by more than this is not live


def register_worker(
    session: Session,
    worker_id: str,
    capabilities: Mapping[str, Any],
    queues: Sequence[str],
    now: datetime | None = None,
) -> None:
    """Insert or refresh the worker's row for each of its queues (capabilities and heartbeat renewed)."""
    now = now or db_now(session)
    for queue in queues:
        values = {
            "id": worker_id,
            "queue": queue,
            "capabilities": {**capabilities, "queue": queue},
            "started_at": now,
            "heartbeat_at": now,
        }
        upsert(session, Worker, values, keys=("id", "queue"), update=("capabilities", "heartbeat_at"))


def worker_heartbeat(session: Session, worker_id: str, now: datetime | None = None) -> int:
    """Renew the worker's rows; the number renewed (0: they were removed, so register again)."""
    result = session.execute(
        sa.update(Worker)
        .where(Worker.id == worker_id)
        .values(heartbeat_at=now or db_now(session))
        .execution_options(synchronize_session=False)
    )
    return rowcount(result)


def remove_worker(session: Session, worker_id: str) -> int:
    return rowcount(session.execute(sa.delete(Worker).where(Worker.id == worker_id)))


def live_workers(session: Session, stale_after_s: float, now: datetime | None = None) -> list[Worker]:
    """Rows that beat within `stale_after_s` of the database's now (and not after it), oldest registration
    first."""
    query = sa.select(Worker).where(_live(now or db_now(session), stale_after_s))
    return list(session.scalars(query.order_by(Worker.started_at, Worker.id, Worker.queue)))


def _live(now: datetime, stale_after_s: float) -> sa.ColumnElement[bool]:
    since = now - timedelta(seconds=stale_after_s)
    return sa.and_(Worker.heartbeat_at >= since, Worker.heartbeat_at <= now + FUTURE_SLACK)


def live_queues(session: Session, stale_after_s: float, now: datetime | None = None) -> set[str]:
    """The queues consumed by at least one live worker (one that beat within `stale_after_s`)."""
    query = sa.select(Worker.queue).where(_live(now or db_now(session), stale_after_s)).distinct()
    return {str(queue) for queue in session.scalars(query)}


def jobs_without_worker(
    session: Session, stale_after_s: float, now: datetime | None = None
) -> dict[str, int]:
    """queue → the jobs waiting for a worker (WAITING_STATUSES) in that queue while no live worker serves
    it; queues with none are left out."""
    served = sa.select(Worker.queue).where(_live(now or db_now(session), stale_after_s))
    rows = session.execute(
        sa.select(Job.queue, sa.func.count(Job.id))
        .where(Job.status.in_(WAITING_STATUSES), Job.queue.not_in(served))
        .group_by(Job.queue)
    ).all()
    return {str(queue): int(count) for queue, count in rows}


def forget_workers(session: Session, older_than: timedelta, now: datetime | None = None) -> int:
    """Delete rows whose last beat is further than `older_than` from the database's now, before it or after
    it (they no longer count anyway)."""
    now = now or db_now(session)
    far = sa.or_(Worker.heartbeat_at < now - older_than, Worker.heartbeat_at > now + older_than)
    return rowcount(session.execute(sa.delete(Worker).where(far)))
