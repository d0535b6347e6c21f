"""Jobs on the API side: create (with Idempotency-Key), read, list, and the user's state changes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from store.async_pool import StatementPool
from store.errors import Conflict, Invalid
from store.ids import new_id
from store.models import (
    ACTIVE_STATUSES,
    DEFAULT_MAX_LOST_WORKERS,
    TERMINAL_STATUSES,
    Job,
    JobEvent,
    utcnow,
)
from store.repository._common import newest_first_page, rowcount
from store.repository.events import append_event


@dataclass(frozen=True)
class NewJob:
    """A validated job, ready to insert (the route builds it from the request)."""

    tenant_id: str
    name: str | None
    spec: dict[str, Any]
    resolved_spec: dict[str, Any]
    spec_hash: str
    model: str
    algorithm: str
    queue: str
    training_file_id: str | None
    metadata: dict[str, str]
    total_steps: int
    max_attempts: int
    idempotency_key: str | None = None
    request_hash: str | None = None
    max_lost_workers: int = DEFAULT_MAX_LOST_WORKERS
    # A job with a grader: its loophole check's warnings at submission (docs/GRADERS.md), kept in the
    # job's first event (level warn when there are any).
    grader_warnings: list[dict[str, Any]] | None = None
    # What will likely make it learn nothing, known at submission (contract.warnings), kept there too.
    warnings: list[dict[str, Any]] | None = None


def _new_job_rows(new: NewJob) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job row (by ORM attribute name) and its first event, as create_job writes them."""
    now = utcnow()
    job_id = new_id("job")
    values: dict[str, Any] = {
        "id": job_id,
        "tenant_id": new.tenant_id,
        "name": new.name,
        "status": "queued",
        "spec": new.spec,
        "resolved_spec": new.resolved_spec,
        "spec_hash": new.spec_hash,
        "model": new.model,
        "algorithm": new.algorithm,
        "queue": new.queue,
        "training_file_id": new.training_file_id,
        "job_metadata": new.metadata,
        "run_dir": f"{new.tenant_id}/{job_id}/run",
        "total_steps": new.total_steps,
        "current_step": 0,
        "attempt": 0,
        "failures": 0,
        "max_attempts": new.max_attempts,
        "lost_workers": 0,
        "max_lost_workers": new.max_lost_workers,
        "crash_streak": 0,
        "crash_step": None,
        "event_seq": 1,
        "idempotency_key": new.idempotency_key,
        "request_hash": new.request_hash,
        "enqueued_at": now,  # the route rings the doorbell right after commit; the sweeper repairs a lost ring
        "created_at": now,
        "updated_at": now,
    }
    first_event = {
        "job_id": job_id,
        "seq": 1,
        "type": "job.created",
        "level": "warn" if new.grader_warnings or new.warnings else "info",
        "message": "Job created and queued"
        + (" (the grader has loophole warnings)" if new.grader_warnings else ""),
        "data": {
            "queue": new.queue,
            "total_steps": new.total_steps,
            **({"grader_warnings": new.grader_warnings} if new.grader_warnings is not None else {}),
            **({"warnings": new.warnings} if new.warnings else {}),
        },
        "created_at": now,
    }
    return values, first_event


def count_waiting(session: Session, queue: str) -> int:
    """Jobs of `queue` that wait for a worker (queued or recovering): each should have a doorbell."""
    return int(
        session.scalar(
            sa.select(sa.func.count(Job.id)).where(
                Job.queue == queue, Job.status.in_(("queued", "recovering"))
            )
        )
        or 0
    )


# The columns the job object shows, labelled with their ORM attribute names, so a Core row reads like a Job
# (job.job_metadata). Not the submitted spec, the lease or the idempotency record.
_JOB_VIEW_COLUMNS = [
    column.label(attr.key)
    for attr in Job.__mapper__.column_attrs
    if attr.key
    not in {"spec", "spec_hash", "lease_token", "lease_owner", "idempotency_key", "request_hash", "event_seq"}
    for column in attr.columns
]


_READ_JOB = sa.select(*_JOB_VIEW_COLUMNS).where(
    Job.id == sa.bindparam("job_id"), Job.tenant_id == sa.bindparam("tenant_id")
)
_JOB_VIEW_KEYS = [column.key for column in _JOB_VIEW_COLUMNS]

# A job of the queue that is cancelling: its worker is busy until its trainer has stopped.
_CANCELLING_IN_QUEUE = sa.select(
    sa.exists()
    .where(Job.queue == sa.bindparam("queue"), Job.status == sa.literal_column("'cancelling'"))
    .label("found")
)


async def cancelling_in_queue(pool: StatementPool, queue: str) -> bool:
    """Whether a job of `queue` (any tenant's) is cancelling: a job queued there may wait behind it."""
    row = await pool.fetch_one(_CANCELLING_IN_QUEUE, {"queue": queue}, idempotent=True)
    return bool(row and row["found"])


async def read_job(pool: StatementPool, tenant_id: str, job_id: str) -> SimpleNamespace | None:
    """The job's shown columns as a read-only object, in one autocommit statement (no ORM identity map, no
    transaction): the hot path of GET /v1/jobs/{id}, on the event loop on PostgreSQL."""
    row = await pool.fetch_one(_READ_JOB, {"job_id": job_id, "tenant_id": tenant_id}, idempotent=True)
    return SimpleNamespace(**row) if row is not None else None


# ---- the API's awaited statements (POST /v1/jobs, the estimate's counts, the active-job limit):
# one function per operation, on the database's event-loop pool (store.async_pool) whatever the database.

_JOBS, _EVENTS = Job.metadata.tables["jobs"], JobEvent.metadata.tables["job_events"]
_JOB_COLUMNS = {attr.key: attr.columns[0] for attr in Job.__mapper__.column_attrs}
_EVENT_COLUMNS = ("job_id", "seq", "type", "level", "message", "data", "created_at")

# The job and its first event: two statements in one transaction (pipelined on PostgreSQL: one round trip).
# ON CONFLICT on (tenant_id, idempotency_key) makes a request that loses an Idempotency-Key race insert
# nothing (it waits for the winner's commit, then returns no row and replays the winner's job); the event is
# inserted only beside a job row of its id, so the loser writes no event either. A job without a key (NULL)
# never conflicts. `postgresql.insert` compiles on SQLite too (the same ON CONFLICT ... DO NOTHING clause).
_INSERT_JOB = (
    postgresql.insert(_JOBS)
    .values({column: sa.bindparam(key, type_=column.type) for key, column in _JOB_COLUMNS.items()})
    .on_conflict_do_nothing(index_elements=[_JOBS.c.tenant_id, _JOBS.c.idempotency_key])
    .returning(_JOBS.c.id)
)
_INSERT_FIRST_EVENT = sa.insert(_EVENTS).from_select(
    list(_EVENT_COLUMNS),
    sa.select(
        _JOBS.c.id,
        *(sa.bindparam(f"first_event_{name}", type_=_EVENTS.c[name].type) for name in _EVENT_COLUMNS[1:]),
    ).where(_JOBS.c.id == sa.bindparam("first_event_job_id")),
)

_FIND_BY_IDEMPOTENCY_KEY = sa.select(*_JOB_VIEW_COLUMNS, Job.request_hash).where(
    Job.tenant_id == sa.bindparam("tenant_id"), Job.idempotency_key == sa.bindparam("key")
)
# The statuses are our own constants, written into the SQL (no list parameter: the same text on both databases).
_COUNT_ACTIVE_JOBS = sa.select(sa.func.count(Job.id).label("active")).where(
    Job.tenant_id == sa.bindparam("tenant_id"),
    Job.status.in_([sa.literal_column(f"'{status}'") for status in ACTIVE_STATUSES]),
)
_COUNT_QUEUED = sa.select(sa.func.count(Job.id).label("queued")).where(
    Job.queue == sa.bindparam("queue"), Job.status == sa.literal_column("'queued'")
)


async def create_job(pool: StatementPool, new: NewJob) -> tuple[SimpleNamespace, bool]:
    """Insert a queued job and its first event, committed when this returns: (job, created).

    With an idempotency key: the same key and the same request returns the existing job (created False);
    the same key with a different request is a 422. Concurrent requests with one key serialise on the unique
    index: the loser inserts nothing and replays the winner's job."""
    if new.idempotency_key is not None:
        existing = await find_job_by_idempotency_key(
            pool, new.tenant_id, new.idempotency_key, new.request_hash
        )
        if existing is not None:
            return existing, False
    values, first_event = _new_job_rows(new)
    event = {f"first_event_{name}": first_event[name] for name in _EVENT_COLUMNS}
    inserted, _ = await pool.fetch_in_transaction(
        [(_INSERT_JOB, {key: values.get(key) for key in _JOB_COLUMNS}), (_INSERT_FIRST_EVENT, event)]
    )
    if inserted is None:  # the key was taken by a concurrent request, which has committed by now
        assert new.idempotency_key is not None
        existing = await find_job_by_idempotency_key(
            pool, new.tenant_id, new.idempotency_key, new.request_hash
        )
        if existing is None:  # created and deleted in between
            raise Conflict("the request conflicts with a concurrent change; retry it")
        return existing, False
    view = dict.fromkeys(_JOB_VIEW_KEYS)
    view.update(values)
    return SimpleNamespace(**view), True


async def find_job_by_idempotency_key(
    pool: StatementPool, tenant_id: str, key: str, request_hash: str | None
) -> SimpleNamespace | None:
    """The job created with this key (its view columns), or None; 422 when the key was used for a different
    request."""
    row = await pool.fetch_one(
        _FIND_BY_IDEMPOTENCY_KEY, {"tenant_id": tenant_id, "key": key}, idempotent=True
    )
    if row is None:
        return None
    if row.pop("request_hash") != request_hash:
        raise Invalid(
            "this Idempotency-Key was already used with a different request",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    return SimpleNamespace(**row)


async def count_active_jobs(pool: StatementPool, tenant_id: str) -> int:
    """The tenant's jobs that have not finished (the active-job limit counts them)."""
    row = await pool.fetch_one(_COUNT_ACTIVE_JOBS, {"tenant_id": tenant_id}, idempotent=True)
    return int(row["active"]) if row is not None else 0


async def count_queued(pool: StatementPool, queue: str) -> int:
    """Jobs queued on `queue` now (the estimate's jobs_ahead)."""
    row = await pool.fetch_one(_COUNT_QUEUED, {"queue": queue}, idempotent=True)
    return int(row["queued"]) if row is not None else 0


def get_job(session: Session, tenant_id: str, job_id: str) -> Job | None:
    return session.scalar(sa.select(Job).where(Job.id == job_id, Job.tenant_id == tenant_id))


def list_jobs(
    session: Session, tenant_id: str, *, after: str | None, limit: int, status: str | None = None
) -> tuple[list[Job], bool]:
    """Newest first; `after` is the id of the last job of the previous page."""
    query = sa.select(Job).where(Job.tenant_id == tenant_id)
    if status is not None:
        query = query.where(Job.status == status)
    return newest_first_page(session, query, Job.id, after, limit)


def mark_enqueued(session: Session, job_ids: Sequence[str], now: datetime | None = None) -> None:
    """Record that a doorbell was sent (the sweeper re-sends to jobs whose doorbell is old)."""
    if job_ids:
        session.execute(
            sa.update(Job)
            .where(Job.id.in_(job_ids))
            .values(enqueued_at=now or utcnow())
            .execution_options(synchronize_session=False)
        )


def _transition(session: Session, job: Job, from_statuses: Iterable[str], **values: Any) -> bool:
    """Conditional status change; True when this call made it (the row was in one of from_statuses)."""
    now = utcnow()
    result = session.execute(
        sa.update(Job)
        .where(Job.id == job.id, Job.status.in_(tuple(from_statuses)))
        .values(updated_at=now, **values)
        .execution_options(synchronize_session=False)
    )
    changed = rowcount(result) == 1
    session.refresh(job)
    return changed


def request_cancel(session: Session, job: Job) -> Job:
    """Cancel: at once when no worker holds the job; else `cancelling` (the worker stops at its next step).

    Idempotent for a job already cancelling or cancelled; 409 for a job that finished otherwise.
    """
    now = utcnow()
    idle = ("validating", "queued", "paused", "recovering")
    if _transition(session, job, idle, status="cancelled", finished_at=now, lease_token=None):
        append_event(session, job.id, "job.cancelled", "Job cancelled before it ran again")
    elif _transition(session, job, ("running", "pausing"), status="cancelling"):
        append_event(session, job.id, "job.cancel_requested", "Cancellation requested; the worker will stop")
    elif job.status not in ("cancelling", "cancelled"):
        raise Conflict(f"job {job.id} has already {job.status}", code="job_not_cancellable")
    return job


def request_pause(session: Session, job: Job) -> Job:
    """Pause: at once when not running; else `pausing` (the worker checkpoints and releases the job)."""
    if _transition(session, job, ("validating", "queued", "recovering"), status="paused", lease_token=None):
        append_event(session, job.id, "job.paused", "Job paused before it ran")
    elif _transition(session, job, ("running",), status="pausing"):
        append_event(session, job.id, "job.pause_requested", "Pause requested; the worker will checkpoint")
    elif job.status not in ("pausing", "paused"):
        raise Conflict(f"job {job.id} is {job.status} and cannot be paused", code="job_not_pausable")
    return job


def resume_job(session: Session, job: Job) -> bool:
    """Resume a paused (or pausing) job, or one that failed on a system fault (a full or read-only disk, a
    spent retry budget) once the fault is fixed: it is queued again with fresh budgets and continues from its
    latest checkpoint. Returns True when it must be enqueued again (after commit). A job that failed on a
    user error (a bad spec, a non-finite loss) is not resumable: it would fail the same way."""
    if _transition(session, job, ("paused",), status="queued"):
        append_event(session, job.id, "job.resumed", "Job resumed; it continues from its latest checkpoint")
        return True
    if _transition(session, job, ("pausing",), status="running"):
        append_event(session, job.id, "job.resumed", "Pause withdrawn before the worker stopped")
        return False
    if job.status == "failed" and job.error_category == "system":
        cause = job.error_code
        cleared = {"error_code": None, "error_message": None, "error_param": None, "error_category": None}
        fresh = {"failures": 0, "lost_workers": 0, "crash_streak": 0, "crash_step": None}
        if _transition(session, job, ("failed",), status="queued", finished_at=None, **cleared, **fresh):
            append_event(
                session,
                job.id,
                "job.resumed",
                f"Job resumed after a system failure ({cause}); it continues from its latest checkpoint",
                data={"after_error": cause},
            )
            return True
    if job.status == "failed":
        raise Conflict(
            f"job {job.id} failed on a user error ({job.error_code}); fix the spec and submit a new job",
            code="job_not_resumable",
        )
    raise Conflict(f"job {job.id} is {job.status}, not paused or failed", code="job_not_paused")


def delete_job(session: Session, job: Job) -> None:
    """Delete a finished job and (by cascade) its events, metrics, evals and checkpoint rows."""
    if job.status not in TERMINAL_STATUSES:
        raise Conflict(
            f"job {job.id} is {job.status}; only succeeded, failed or cancelled jobs can be deleted",
            code="job_not_terminal",
        )
    session.execute(sa.delete(Job).where(Job.id == job.id, Job.status.in_(tuple(TERMINAL_STATUSES))))
    session.expunge(job)


def job_status_counts(session: Session) -> list[tuple[str, str, int]]:
    """(status, queue, count) over all tenants, for /metrics."""
    rows = session.execute(
        sa.select(Job.status, Job.queue, sa.func.count(Job.id)).group_by(Job.status, Job.queue)
    ).all()
    return [(status, queue, int(count)) for status, queue, count in rows]
