"""The sweeper rings a waiting job's doorbell again only when the broker is short of messages for its queue
(real PostgreSQL; the broker's depth is given, as the Redis LLEN would give it)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from store import repository
from store.database import Database
from store.models import Job
from tests.service.conftest import (  # noqa: F401 - the service suite's fixtures, used here by name
    TenantKey,
    artifact_root,
    db,
    make_tenant,
    pg_url,
    postgres,
    tenant,
)
from tests.service.helpers import new_job
from worker.settings import WorkerSettings
from worker.sweeper import sweep_once


def _waiting_jobs(db: Database, tenant_id: str, queue: str, n: int) -> list[str]:  # noqa: F811
    """n queued jobs on their own queue whose doorbell rang an hour ago."""
    ids = []
    for _ in range(n):
        job, _ = asyncio.run(repository.create_job(db.async_pool, new_job(tenant_id, queue=queue)))
        ids.append(job.id)
    with db.transaction() as session:
        old = repository.utcnow() - timedelta(hours=1)
        session.execute(sa.update(Job).where(Job.id.in_(ids)).values(enqueued_at=old))
    return sorted(ids)


@pytest.mark.parametrize(
    ("depth", "expected"),
    [
        (3, 0),  # a message per waiting job: they wait behind busy workers, no second doorbell
        (5, 0),  # stale messages too (claimed or cancelled jobs): still nothing to add
        (1, 2),  # two doorbells short (e.g. part of the queue lost in a Redis restart)
        (0, 3),  # the queue is empty (Redis flushed): every waiting job is rung
        (None, 3),  # depth unknown (another broker, Redis unreachable): every old doorbell is rung again
    ],
)
def test_only_missing_doorbells_are_rung_again(
    db: Database,  # noqa: F811
    tenant: TenantKey,  # noqa: F811
    pg_url: str,  # noqa: F811
    artifact_root: Path,  # noqa: F811
    depth: int | None,
    expected: int,
) -> None:
    queue = f"doorbell-{uuid.uuid4().hex[:8]}"
    jobs = _waiting_jobs(db, tenant.tenant_id, queue, 3)
    settings = WorkerSettings(database_url=pg_url, artifact_root=artifact_root, unclaimed_after_s=60)
    sent: list[tuple[str, str]] = []
    depths: list[str] = []

    def queue_depth(name: str) -> int | None:
        # Other tests' jobs wait on their own queues in this database: those queues look full.
        depths.append(name)
        return depth if name == queue else 10**6

    counts = sweep_once(
        db, settings, lambda j, q: sent.append((j, q)), recover_stale=False, queue_depth=queue_depth
    )
    assert depths.count(queue) == 1
    assert counts["resent"] == expected
    assert sent == [(job_id, queue) for job_id in jobs[:expected]]  # the oldest first

    # Rung jobs have a fresh doorbell; the rest are considered again on the next pass.
    with db.sessions() as session:
        fresh = session.scalars(
            sa.select(Job.id).where(
                Job.id.in_(jobs), Job.enqueued_at > repository.utcnow() - timedelta(minutes=1)
            )
        ).all()
    assert sorted(fresh) == jobs[:expected]
    if depth == 1:  # the broker delivered nothing meanwhile: one message now waits per rung job, plus 1

        def sweep_with_depth(our_depth: int) -> list[tuple[str, str]]:
            rung: list[tuple[str, str]] = []
            sweep_once(
                db,
                settings,
                lambda j, q: rung.append((j, q)),
                recover_stale=False,
                queue_depth=lambda name: our_depth if name == queue else 10**6,
            )
            return rung

        assert sweep_with_depth(3) == []
        assert sweep_with_depth(2) == [(jobs[2], queue)]


def test_without_a_depth_reader_every_old_doorbell_is_rung(
    db: Database,  # noqa: F811
    tenant: TenantKey,  # noqa: F811
    pg_url: str,  # noqa: F811
    artifact_root: Path,  # noqa: F811
) -> None:
    queue = f"doorbell-{uuid.uuid4().hex[:8]}"
    jobs = _waiting_jobs(db, tenant.tenant_id, queue, 2)
    settings = WorkerSettings(database_url=pg_url, artifact_root=artifact_root, unclaimed_after_s=60)
    sent: list[tuple[str, str]] = []
    sweep_once(db, settings, lambda j, q: sent.append((j, q)), recover_stale=False)
    assert sorted(j for j, q in sent if q == queue) == jobs
