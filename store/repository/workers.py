"""The worker registry: workers advertise what they can run, beat, and leave; the service reads who is live.

A worker writes one row per queue it consumes (`register_worker`, at start and whenever its heartbeat finds
its row gone), renews `heartbeat_at` every beat (`worker_heartbeat`) and deletes its rows at a clean stop
(`remove_worker`). `live_workers` returns the rows that beat after a cutoff: a worker that stopped beating
(killed, host lost) stops counting once its last beat is older than the service's stale time, and
`forget_workers` deletes such rows (the sweeper's housekeeping). Capabilities are stored as given (the JSON
of contract.fleet.WorkerClass); the store does not interpret them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from store.models import Worker, utcnow
from store.repository._common import rowcount, upsert


def register_worker(
    session: Session,
    worker_id: str,
    capabilities: Mapping[str, Any],
    queues: Sequence[str],
    now: datetime | None = None,
) -> None:
    """Insert or refresh the worker's row for each of its queues (capabilities and heartbeat renewed)."""
    now = now or utcnow()
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
        .values(heartbeat_at=now or utcnow())
        .execution_options(synchronize_session=False)
    )
    return rowcount(result)


def remove_worker(session: Session, worker_id: str) -> int:
    return rowcount(session.execute(sa.delete(Worker).where(Worker.id == worker_id)))


def live_workers(session: Session, since: datetime) -> list[Worker]:
    """Rows that beat at or after `since`, oldest registration first."""
    query = sa.select(Worker).where(Worker.heartbeat_at >= since)
    return list(session.scalars(query.order_by(Worker.started_at, Worker.id, Worker.queue)))


def forget_workers(session: Session, before: datetime) -> int:
    """Delete rows whose last beat is older than `before` (they no longer count anyway)."""
    return rowcount(session.execute(sa.delete(Worker).where(Worker.heartbeat_at < before)))
