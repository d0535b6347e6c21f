"""All SQL of the service and of the worker, in one module. Functions take a Session and never commit.

API side: every read and write of a tenant's object takes the tenant id (files, jobs, keys) or a job that
was already loaded with it (events, metrics, checkpoints), so scoping happens here and only here.

Worker side (issue 5): claim_job, heartbeat, record_step_metrics, record_eval, append_event, add_checkpoint,
finish_job, retry_job take the job's lease token and fence on it. The fence is the first statement of the
write: an UPDATE of the job row `WHERE id = :job AND lease_token = :token AND status IN (leased states)`.
When it matches no row the lease is gone (the sweeper recovered the job, or another worker claimed it), the
function writes nothing else and returns False/None, and the worker must stop. The caller commits:

    with db.transaction() as session:          # commits on success
        if not repository.record_step_metrics(session, job_id, token, step, metrics):
            raise LeaseLost(job_id)

Idempotency: metric and eval rows are unique per (job, step) and a repeated write overwrites the row (a
step redone after a resume keeps its last values); checkpoints are unique per (job, step); an event with a
dedupe_key is written once. Non-finite floats in metrics are stored as null (PostgreSQL JSON has no NaN).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import PurePosixPath
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from psycopg.types.json import Jsonb
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service import keys
from service.async_pool import AsyncPool
from service.errors import Conflict, Unprocessable
from service.ids import new_id
from service.models import (
    ACTIVE_STATUSES,
    CRASH_LOOP_STREAK,
    DEFAULT_MAX_LOST_WORKERS,
    LEASED_STATUSES,
    TERMINAL_STATUSES,
    ApiKey,
    Checkpoint,
    File,
    Job,
    JobEval,
    JobEvent,
    JobMetric,
    Tenant,
    utcnow,
)

KEY_TOUCH_INTERVAL = timedelta(seconds=60)
STEP_SECONDS_METRIC = "perf/step_seconds"
STEP_SECONDS_EMA_WEIGHT = 0.1


# ------------------------------------------------------------------------------------------------ tenants


def create_tenant(session: Session, name: str) -> Tenant:
    if session.scalar(sa.select(Tenant.id).where(Tenant.name == name)) is not None:
        raise Conflict(f"a tenant named {name!r} already exists", param="name", code="tenant_exists")
    tenant = Tenant(id=new_id("ten"), name=name, created_at=utcnow())
    session.add(tenant)
    session.flush()
    return tenant


def get_tenant_by_name(session: Session, name: str) -> Tenant | None:
    return session.scalar(sa.select(Tenant).where(Tenant.name == name))


@dataclass(frozen=True)
class TenantUsage:
    active_jobs: int
    jobs: int
    files: int
    file_bytes: int


def tenant_usage(session: Session, tenant_id: str) -> TenantUsage:
    jobs, active = session.execute(
        sa.select(sa.func.count(Job.id), sa.func.count(Job.id).filter(Job.status.in_(ACTIVE_STATUSES))).where(
            Job.tenant_id == tenant_id
        )
    ).one()
    files, file_bytes = session.execute(
        sa.select(sa.func.count(File.id), sa.func.coalesce(sa.func.sum(File.bytes), 0)).where(
            File.tenant_id == tenant_id
        )
    ).one()
    return TenantUsage(active_jobs=active, jobs=jobs, files=files, file_bytes=int(file_bytes))


# ----------------------------------------------------------------------------------------------- API keys


def create_api_key(session: Session, tenant_id: str, name: str) -> tuple[ApiKey, str]:
    """A new key for the tenant; returns the row and the secret (shown once, never stored)."""
    secret = keys.generate_key()
    row = ApiKey(
        id=new_id("key"),
        tenant_id=tenant_id,
        name=name,
        prefix=keys.key_prefix(secret),
        key_hash=keys.hash_key(secret),
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row, secret


def find_api_key(session: Session, presented: str) -> tuple[ApiKey, Tenant] | None:
    """The key row (revoked or not) and its tenant when `presented` is a real key, else None."""
    if not keys.looks_like_key(presented):
        return None
    found = session.execute(
        sa.select(ApiKey, Tenant)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(ApiKey.prefix == keys.key_prefix(presented))
    ).one_or_none()
    if found is None or not keys.key_matches(presented, found[0].key_hash):
        return None
    return found[0], found[1]


def touch_api_key(session: Session, key: ApiKey, now: datetime | None = None) -> bool:
    """Record use at most once a minute per key (no write on most requests). True when it wrote."""
    now = now or utcnow()
    if key.last_used_at is not None and now - key.last_used_at < KEY_TOUCH_INTERVAL:
        return False
    session.execute(
        sa.update(ApiKey)
        .where(ApiKey.id == key.id)
        .values(last_used_at=now)
        .execution_options(synchronize_session=False)
    )
    key.last_used_at = now
    return True


def list_api_keys(session: Session, tenant_id: str) -> list[ApiKey]:
    return list(session.scalars(sa.select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.id)))


def get_api_key(session: Session, tenant_id: str, key_id: str) -> ApiKey | None:
    return session.scalar(sa.select(ApiKey).where(ApiKey.id == key_id, ApiKey.tenant_id == tenant_id))


def revoke_api_key(session: Session, key: ApiKey) -> ApiKey:
    """Revoke; refuses the tenant's last active key (409), which would lock the tenant out."""
    if key.revoked_at is not None:
        return key
    others = session.scalar(
        sa.select(sa.func.count(ApiKey.id)).where(
            ApiKey.tenant_id == key.tenant_id, ApiKey.revoked_at.is_(None), ApiKey.id != key.id
        )
    )
    if not others:
        raise Conflict(
            "this is the tenant's last active key; create another key before revoking it",
            code="last_active_key",
        )
    key.revoked_at = utcnow()
    session.flush()
    return key


# -------------------------------------------------------------------------------------------------- files


def create_file(
    session: Session,
    *,
    file_id: str,
    tenant_id: str,
    filename: str,
    purpose: str,
    size: int,
    sha256: str,
    records: int,
    storage_key: str,
) -> File:
    row = File(
        id=file_id,
        tenant_id=tenant_id,
        filename=filename,
        purpose=purpose,
        bytes=size,
        sha256=sha256,
        records=records,
        storage_key=storage_key,
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row


def get_file(session: Session, tenant_id: str, file_id: str) -> File | None:
    return session.scalar(sa.select(File).where(File.id == file_id, File.tenant_id == tenant_id))


def list_files(
    session: Session, tenant_id: str, *, after: str | None, limit: int, purpose: str | None = None
) -> tuple[list[File], bool]:
    query = sa.select(File).where(File.tenant_id == tenant_id)
    if purpose is not None:
        query = query.where(File.purpose == purpose)
    return _newest_first_page(session, query, File.id, after, limit)


def delete_file(session: Session, file: File) -> None:
    """Delete the row; 409 while a job that has not finished reads the file."""
    user = session.scalar(
        sa.select(Job.id).where(Job.training_file_id == file.id, Job.status.in_(ACTIVE_STATUSES)).limit(1)
    )
    if user is not None:
        raise Conflict(f"file {file.id} is used by job {user}, which has not finished", code="file_in_use")
    session.delete(file)
    session.flush()


# --------------------------------------------------------------------------------------------------- jobs


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


def count_active_jobs(session: Session, tenant_id: str) -> int:
    return int(
        session.scalar(
            sa.select(sa.func.count(Job.id)).where(
                Job.tenant_id == tenant_id, Job.status.in_(ACTIVE_STATUSES)
            )
        )
        or 0
    )


def _new_job_rows(new: NewJob) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job row (by ORM attribute name) and its first event, as create_job and create_job_async write them."""
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
        "level": "info",
        "message": "Job created and queued",
        "data": {"queue": new.queue, "total_steps": new.total_steps},
        "created_at": now,
    }
    return values, first_event


def create_job(session: Session, new: NewJob) -> tuple[Job, bool]:
    """Insert a queued job and its first event; returns (job, created).

    With an idempotency key: the same key and the same request returns the existing job (created False);
    the same key with a different request is a 422. Concurrent requests with one key serialise on the
    unique index: the loser replays the winner's job.
    """
    if new.idempotency_key is not None:
        existing = find_job_by_idempotency_key(session, new.tenant_id, new.idempotency_key, new.request_hash)
        if existing is not None:
            return existing, False
    values, first_event = _new_job_rows(new)

    def insert() -> None:  # two plain INSERTs (no unit-of-work flush)
        session.execute(sa.insert(Job), [values])
        session.execute(sa.insert(JobEvent), [first_event])

    if new.idempotency_key is None:
        insert()
    else:
        try:
            with session.begin_nested():  # a concurrent request with the same key loses here, and replays
                insert()
        except IntegrityError:
            existing = find_job_by_idempotency_key(
                session, new.tenant_id, new.idempotency_key, new.request_hash
            )
            if existing is None:
                raise
            return existing, False
    return Job(**values), True  # a detached copy of the row just written, for the response


def find_job_by_idempotency_key(
    session: Session, tenant_id: str, key: str, request_hash: str | None
) -> Job | None:
    """The job created with this key, or None; 422 when the key was used for a different request."""
    job = session.scalar(sa.select(Job).where(Job.tenant_id == tenant_id, Job.idempotency_key == key))
    if job is not None and job.request_hash != request_hash:
        raise Unprocessable(
            "this Idempotency-Key was already used with a different request",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    return job


def count_queued(session: Session, queue: str) -> int:
    return int(
        session.scalar(sa.select(sa.func.count(Job.id)).where(Job.queue == queue, Job.status == "queued"))
        or 0
    )


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
_READ_JOB_SQL = str(_READ_JOB.compile(dialect=postgresql.psycopg.dialect()))
_JOB_VIEW_KEYS = [column.key for column in _JOB_VIEW_COLUMNS]


def read_job(conn: Connection, tenant_id: str, job_id: str) -> Row[Any] | None:
    """The job as a read-only row in one statement (no ORM identity map, no transaction)."""
    return conn.execute(_READ_JOB, {"job_id": job_id, "tenant_id": tenant_id}).one_or_none()


async def read_job_async(pool: AsyncPool, tenant_id: str, job_id: str) -> SimpleNamespace | None:
    """read_job on the event loop (PostgreSQL): the hot path of GET /v1/jobs/{id}."""
    row = await pool.fetch_one(_READ_JOB_SQL, {"job_id": job_id, "tenant_id": tenant_id}, idempotent=True)
    return SimpleNamespace(**row) if row is not None else None


# ---- the job creation path on the event loop (PostgreSQL): POST /v1/jobs without a session or a thread hop

_JOBS, _EVENTS = Job.metadata.tables["jobs"], JobEvent.metadata.tables["job_events"]
_JOB_COLUMNS = {attr.key: attr.columns[0] for attr in Job.__mapper__.column_attrs}
_EVENT_COLUMNS = ("job_id", "seq", "type", "level", "message", "data", "created_at")

# One statement, so one round trip and one transaction (autocommit): the job and its first event are
# committed together when it returns. ON CONFLICT on (tenant_id, idempotency_key) makes a request that
# loses an Idempotency-Key race insert nothing (it waits for the winner's commit, then returns no row and
# replays the winner's job); a job without a key (NULL) never conflicts.
_NEW_JOB = (
    postgresql.insert(_JOBS)
    .values({column: sa.bindparam(key, type_=column.type) for key, column in _JOB_COLUMNS.items()})
    .on_conflict_do_nothing(index_elements=[_JOBS.c.tenant_id, _JOBS.c.idempotency_key])
    .returning(_JOBS.c.id)
    .cte("new_job")
)
_CREATE_JOB = sa.insert(_EVENTS).from_select(
    list(_EVENT_COLUMNS),
    sa.select(
        _NEW_JOB.c.id,
        *(sa.bindparam(f"first_event_{name}", type_=_EVENTS.c[name].type) for name in _EVENT_COLUMNS[1:]),
    ),
)
_CREATE_JOB_SQL = str(_CREATE_JOB.returning(_EVENTS.c.job_id).compile(dialect=postgresql.psycopg.dialect()))

_FIND_BY_IDEMPOTENCY_KEY_SQL = str(
    sa.select(*_JOB_VIEW_COLUMNS, Job.request_hash)
    .where(Job.tenant_id == sa.bindparam("tenant_id"), Job.idempotency_key == sa.bindparam("key"))
    .compile(dialect=postgresql.psycopg.dialect())
)
_GET_FILE_SQL = str(
    sa.select(*(c.label(a.key) for a in File.__mapper__.column_attrs for c in a.columns))
    .where(File.id == sa.bindparam("file_id"), File.tenant_id == sa.bindparam("tenant_id"))
    .compile(dialect=postgresql.psycopg.dialect())
)
_COUNT_ACTIVE_JOBS_SQL = str(
    sa.select(sa.func.count(Job.id).label("active"))
    .where(
        Job.tenant_id == sa.bindparam("tenant_id"),
        Job.status == sa.any_(sa.bindparam("statuses", type_=postgresql.ARRAY(sa.String()))),
    )
    .compile(dialect=postgresql.psycopg.dialect())
)


_JOB_JSON_KEYS = frozenset(key for key, column in _JOB_COLUMNS.items() if isinstance(column.type, sa.JSON))
_EVENT_JSON_KEYS = frozenset(name for name in _EVENT_COLUMNS if isinstance(_EVENTS.c[name].type, sa.JSON))


def _statement_params(
    values: Mapping[str, Any], json_keys: frozenset[str], prefix: str = ""
) -> dict[str, Any]:
    """Parameters for psycopg: JSON values wrapped as Jsonb (SQLAlchemy's bind processing is bypassed)."""
    return {
        f"{prefix}{key}": Jsonb(value) if key in json_keys and value is not None else value
        for key, value in values.items()
    }


async def create_job_async(pool: AsyncPool, new: NewJob) -> tuple[SimpleNamespace, bool]:
    """create_job on the event loop, in one autocommit statement: (job, created). Same rows, same
    Idempotency-Key semantics: an existing key with the same request replays its job (created False), with a
    different request is a 422; the loser of a race on one key replays the winner's job."""
    if new.idempotency_key is not None:
        existing = await find_job_by_idempotency_key_async(
            pool, new.tenant_id, new.idempotency_key, new.request_hash
        )
        if existing is not None:
            return existing, False
    values, first_event = _new_job_rows(new)
    params = _statement_params({key: values.get(key) for key in _JOB_COLUMNS}, _JOB_JSON_KEYS)
    first = {name: first_event[name] for name in _EVENT_COLUMNS[1:]}
    params.update(_statement_params(first, _EVENT_JSON_KEYS, prefix="first_event_"))
    inserted = await pool.fetch_one(_CREATE_JOB_SQL, params)
    if inserted is None:  # the key was taken by a concurrent request, which has committed by now
        assert new.idempotency_key is not None
        existing = await find_job_by_idempotency_key_async(
            pool, new.tenant_id, new.idempotency_key, new.request_hash
        )
        if existing is None:  # created and deleted in between
            raise Conflict("the request conflicts with a concurrent change; retry it")
        return existing, False
    view = dict.fromkeys(_JOB_VIEW_KEYS)
    view.update(values)
    return SimpleNamespace(**view), True


async def find_job_by_idempotency_key_async(
    pool: AsyncPool, tenant_id: str, key: str, request_hash: str | None
) -> SimpleNamespace | None:
    """find_job_by_idempotency_key on the event loop: the job's view columns, or None; 422 for a reused key."""
    row = await pool.fetch_one(
        _FIND_BY_IDEMPOTENCY_KEY_SQL, {"tenant_id": tenant_id, "key": key}, idempotent=True
    )
    if row is None:
        return None
    if row.pop("request_hash") != request_hash:
        raise Unprocessable(
            "this Idempotency-Key was already used with a different request",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    return SimpleNamespace(**row)


async def get_file_async(pool: AsyncPool, tenant_id: str, file_id: str) -> SimpleNamespace | None:
    row = await pool.fetch_one(_GET_FILE_SQL, {"tenant_id": tenant_id, "file_id": file_id}, idempotent=True)
    return SimpleNamespace(**row) if row is not None else None


async def count_active_jobs_async(pool: AsyncPool, tenant_id: str) -> int:
    row = await pool.fetch_one(
        _COUNT_ACTIVE_JOBS_SQL,
        {"tenant_id": tenant_id, "statuses": list(ACTIVE_STATUSES)},
        idempotent=True,
    )
    return int(row["active"]) if row is not None else 0


def get_job(session: Session, tenant_id: str, job_id: str) -> Job | None:
    return session.scalar(sa.select(Job).where(Job.id == job_id, Job.tenant_id == tenant_id))


def list_jobs(
    session: Session, tenant_id: str, *, after: str | None, limit: int, status: str | None = None
) -> tuple[list[Job], bool]:
    """Newest first; `after` is the id of the last job of the previous page."""
    query = sa.select(Job).where(Job.tenant_id == tenant_id)
    if status is not None:
        query = query.where(Job.status == status)
    return _newest_first_page(session, query, Job.id, after, limit)


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
    changed = _rowcount(result) == 1
    session.refresh(job)
    return changed


def _rowcount(result: Any) -> int:
    return int(result.rowcount)


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


# ------------------------------------------------------------------------------------------------- events


def append_event(
    session: Session,
    job_id: str,
    type: str,
    message: str,
    *,
    level: str = "info",
    step: int | None = None,
    data: Mapping[str, Any] | None = None,
    lease_token: str | None = None,
    dedupe_key: str | None = None,
) -> int | None:
    """Append an event; returns its seq (1, 2, ... per job), or None when `lease_token` no longer holds.

    The API appends without a token; the worker passes its token (fenced) and, for writes it may retry,
    a dedupe_key (the seq of the first write is returned and nothing new is written).
    """
    if dedupe_key is not None:
        seq = session.scalar(
            sa.select(JobEvent.seq).where(JobEvent.job_id == job_id, JobEvent.dedupe_key == dedupe_key)
        )
        if seq is not None:
            return int(seq)
    fence = sa.update(Job).where(Job.id == job_id)
    if lease_token is not None:
        fence = fence.where(Job.lease_token == lease_token, Job.status.in_(LEASED_STATUSES))
    seq = session.execute(
        fence.values(event_seq=Job.event_seq + 1)
        .returning(Job.event_seq)
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()
    if seq is None:
        return None
    session.add(
        JobEvent(
            job_id=job_id,
            seq=seq,
            type=type,
            level=level,
            message=message,
            step=step,
            data=_json_safe(dict(data)) if data is not None else None,
            dedupe_key=dedupe_key,
            created_at=utcnow(),
        )
    )
    session.flush()
    return int(seq)


def list_events(session: Session, job_id: str, *, after: int, limit: int) -> tuple[list[JobEvent], bool]:
    """Oldest first from seq > after (the SSE stream and the paginated list use the same order)."""
    rows = list(
        session.scalars(
            sa.select(JobEvent)
            .where(JobEvent.job_id == job_id, JobEvent.seq > after)
            .order_by(JobEvent.seq)
            .limit(limit + 1)
        )
    )
    return rows[:limit], len(rows) > limit


# ------------------------------------------------------------------------------------------------ metrics


def list_metrics(
    session: Session, job_id: str, *, since_step: int, until_step: int | None, limit: int
) -> tuple[list[JobMetric], bool]:
    query = sa.select(JobMetric).where(JobMetric.job_id == job_id, JobMetric.step >= since_step)
    if until_step is not None:
        query = query.where(JobMetric.step <= until_step)
    rows = list(session.scalars(query.order_by(JobMetric.step).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def metrics_at_steps(session: Session, job_id: str, steps: Sequence[int]) -> dict[int, dict[str, Any]]:
    if not steps:
        return {}
    rows = session.execute(
        sa.select(JobMetric.step, JobMetric.metrics).where(
            JobMetric.job_id == job_id, JobMetric.step.in_(steps)
        )
    )
    return {int(step): dict(metrics) for step, metrics in rows}


def list_evals(session: Session, job_id: str) -> list[JobEval]:
    return list(session.scalars(sa.select(JobEval).where(JobEval.job_id == job_id).order_by(JobEval.step)))


# -------------------------------------------------------------------------------------------- checkpoints


def list_checkpoints(session: Session, job_id: str) -> list[Checkpoint]:
    return list(
        session.scalars(sa.select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step))
    )


def get_checkpoint(session: Session, job_id: str, checkpoint_id: str) -> Checkpoint | None:
    return session.scalar(
        sa.select(Checkpoint).where(Checkpoint.id == checkpoint_id, Checkpoint.job_id == job_id)
    )


def latest_checkpoint(session: Session, job_id: str) -> Checkpoint | None:
    """The checkpoint to resume from: the latest row (a row exists only for a complete folder)."""
    return session.scalar(
        sa.select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step.desc()).limit(1)
    )


def set_checkpoint_archive(session: Session, checkpoint: Checkpoint, sha256: str, size: int) -> None:
    session.execute(
        sa.update(Checkpoint)
        .where(Checkpoint.id == checkpoint.id, Checkpoint.path == checkpoint.path)
        .values(archive_sha256=sha256, archive_bytes=size)
        .execution_options(synchronize_session=False)
    )
    checkpoint.archive_sha256, checkpoint.archive_bytes = sha256, size


# ------------------------------------------------------------------------------------------------- report


def report_events(session: Session, job: Job) -> list[dict[str, Any]]:
    """The job's history as the trainer's event stream, for trainer.report.build_report.

    Rebuilt from the rows (one per step, already deduplicated across resumes) rather than stored twice.
    """
    events: list[dict[str, Any]] = []
    started = {"type": "started", "spec": job.resolved_spec, "total_steps": job.total_steps}
    if job.started_at is not None:
        started["time"] = job.started_at.isoformat()
    events.append(started)
    for step, metrics in session.execute(
        sa.select(JobMetric.step, JobMetric.metrics)
        .where(JobMetric.job_id == job.id)
        .order_by(JobMetric.step)
    ):
        events.append({"type": "step", "step": int(step), "metrics": metrics})
    for row in list_evals(session, job.id):
        events.append({"type": "eval", "step": row.step, "metrics": row.metrics})
    for ckpt in list_checkpoints(session, job.id):
        events.append({"type": "checkpoint", "step": ckpt.step, "path": ckpt.id})
    finished_time = job.finished_at.isoformat() if job.finished_at is not None else None
    if job.status == "failed":
        events.append(
            {
                "type": "error",
                "step": job.current_step,
                "message": job.error_message or job.error_code or "failed",
                "time": finished_time,
            }
        )
    elif job.status in ("succeeded", "cancelled"):
        events.append(
            {"type": "finished", "step": job.current_step, "status": job.status, "time": finished_time}
        )
    return events


# ============================================================================================ worker side


@dataclass(frozen=True)
class Claim:
    """What a worker gets when it wins a job."""

    job_id: str
    tenant_id: str
    lease_token: str
    attempt: int
    queue: str
    run_dir: str  # the trainer's OUT, relative to the artifact root
    resolved_spec: dict[str, Any]
    total_steps: int
    latest_checkpoint_step: int | None
    latest_checkpoint_path: str | None


@dataclass(frozen=True)
class JobError:
    code: str
    message: str
    category: str  # "user" (never retried) | "system"
    param: str | None = None


def load_job(session: Session, job_id: str) -> Job | None:
    """A job by id with no tenant scope (the worker and the sweeper only)."""
    return session.get(Job, job_id, populate_existing=True)


def claim_job(
    session: Session, job_id: str, *, owner: str, lease_s: float, now: datetime | None = None
) -> Claim | None:
    """Win the job with one conditional UPDATE, or None when it is not claimable (someone owns it, it was
    cancelled or paused, or it finished). Sets running, a fresh lease token, lease expiry, attempt + 1."""
    now = now or utcnow()
    token = uuid.uuid4().hex
    row = session.execute(
        sa.update(Job)
        .where(Job.id == job_id, Job.status.in_(("queued", "recovering")))
        .values(
            status="running",
            lease_token=token,
            lease_owner=owner[:255],
            lease_expires_at=now + timedelta(seconds=lease_s),
            heartbeat_at=now,
            attempt=Job.attempt + 1,
            started_at=sa.func.coalesce(Job.started_at, now),
            updated_at=now,
        )
        .returning(Job.tenant_id, Job.attempt, Job.queue, Job.run_dir, Job.resolved_spec, Job.total_steps)
        .execution_options(synchronize_session=False)
    ).one_or_none()
    if row is None:
        return None
    latest = latest_checkpoint(session, job_id)
    append_event(
        session,
        job_id,
        "job.running",
        f"Attempt {row.attempt} started on {owner}"
        + (f", resuming from step {latest.step}" if latest is not None else ""),
        data={"attempt": row.attempt, "resume_step": latest.step if latest is not None else None},
        lease_token=token,
    )
    return Claim(
        job_id=job_id,
        tenant_id=row.tenant_id,
        lease_token=token,
        attempt=int(row.attempt),
        queue=row.queue,
        run_dir=row.run_dir,
        resolved_spec=dict(row.resolved_spec),
        total_steps=int(row.total_steps),
        latest_checkpoint_step=latest.step if latest is not None else None,
        latest_checkpoint_path=latest.path if latest is not None else None,
    )


def heartbeat(
    session: Session, job_id: str, lease_token: str, *, lease_s: float, now: datetime | None = None
) -> str | None:
    """Extend the lease. Returns the job's status ("running", or "cancelling"/"pausing": stop cooperatively),
    or None when the lease is lost (stop at once, write nothing more)."""
    now = now or utcnow()
    status = session.execute(
        sa.update(Job)
        .where(Job.id == job_id, Job.lease_token == lease_token, Job.status.in_(LEASED_STATUSES))
        .values(heartbeat_at=now, lease_expires_at=now + timedelta(seconds=lease_s))
        .returning(Job.status)
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()
    return None if status is None else str(status)


def record_step_metrics(
    session: Session,
    job_id: str,
    lease_token: str,
    step: int,
    metrics: Mapping[str, Any],
    *,
    now: datetime | None = None,
) -> bool:
    """Upsert the metric row of (job, step) and the job's latest-step snapshot; False when the lease is lost."""
    now = now or utcnow()
    clean = _json_safe(dict(metrics))
    step_seconds = _finite(clean.get(STEP_SECONDS_METRIC))
    values: dict[str, Any] = {
        "current_step": step,
        "last_metrics": clean,
        "last_step_at": now,
        "updated_at": now,
    }
    if step_seconds is not None:
        values["step_seconds_ema"] = sa.case(
            (Job.step_seconds_ema.is_(None), step_seconds),
            else_=Job.step_seconds_ema * (1 - STEP_SECONDS_EMA_WEIGHT)
            + step_seconds * STEP_SECONDS_EMA_WEIGHT,
        )
    attempt = _fence(session, job_id, lease_token, values, returning=Job.attempt)
    if attempt is None:
        return False
    _upsert(
        session,
        JobMetric,
        {"job_id": job_id, "step": step, "attempt": attempt, "metrics": clean, "created_at": now},
        keys=("job_id", "step"),
        update=("attempt", "metrics", "created_at"),
    )
    return True


def record_eval(
    session: Session,
    job_id: str,
    lease_token: str,
    step: int,
    metrics: Mapping[str, Any],
    *,
    now: datetime | None = None,
) -> bool:
    """Upsert the eval row of (job, step); False when the lease is lost."""
    now = now or utcnow()
    if _fence(session, job_id, lease_token, {"updated_at": now}) is None:
        return False
    _upsert(
        session,
        JobEval,
        {"job_id": job_id, "step": step, "metrics": _json_safe(dict(metrics)), "created_at": now},
        keys=("job_id", "step"),
        update=("metrics", "created_at"),
    )
    return True


def add_checkpoint(
    session: Session,
    job_id: str,
    lease_token: str,
    step: int,
    path: str,
    *,
    size: int | None = None,
    archive_sha256: str | None = None,
    archive_bytes: int | None = None,
    now: datetime | None = None,
) -> str | None:
    """Insert (or, for a step redone after a resume, replace) the checkpoint row of (job, step), after the
    folder was fsynced and renamed into place. `path` is relative to the artifact root. Returns the
    checkpoint id, or None when the lease is lost."""
    relative = PurePosixPath(path)
    if relative.is_absolute() or ".." in relative.parts or not relative.parts or "\\" in path:
        raise ValueError(f"checkpoint path must be relative to the artifact root, without '..': {path!r}")
    now = now or utcnow()
    if _fence(session, job_id, lease_token, {"updated_at": now}) is None:
        return None
    _upsert(
        session,
        Checkpoint,
        {
            "id": new_id("ckpt"),
            "job_id": job_id,
            "step": step,
            "path": str(relative),
            "bytes": size,
            "archive_sha256": archive_sha256,
            "archive_bytes": archive_bytes,
            "created_at": now,
        },
        keys=("job_id", "step"),
        update=("path", "bytes", "archive_sha256", "archive_bytes", "created_at"),
    )
    return session.scalar(
        sa.select(Checkpoint.id).where(Checkpoint.job_id == job_id, Checkpoint.step == step)
    )


def remove_checkpoint(
    session: Session, job_id: str, lease_token: str, step: int, *, now: datetime | None = None
) -> bool:
    """Delete the checkpoint row of (job, step) after the trainer pruned its folder (keep-last-K). False when
    the lease is lost; True otherwise, also when there was no such row (a retried write)."""
    now = now or utcnow()
    if _fence(session, job_id, lease_token, {"updated_at": now}) is None:
        return False
    session.execute(sa.delete(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step == step))
    return True


FINISH_STATUSES = ("succeeded", "failed", "cancelled", "paused")


def finish_job(
    session: Session,
    job_id: str,
    lease_token: str,
    status: str,
    *,
    error: JobError | None = None,
    now: datetime | None = None,
) -> bool:
    """End the worker's run: succeeded, failed (with error), cancelled, or paused (resumable). Releases the
    lease. False when the lease is lost (nothing written)."""
    if status not in FINISH_STATUSES:
        raise ValueError(f"status must be one of {FINISH_STATUSES}, not {status!r}")
    if (status == "failed") != (error is not None):
        raise ValueError("an error is given exactly when the status is 'failed'")
    now = now or utcnow()
    values: dict[str, Any] = {
        "status": status,
        "lease_token": None,
        "lease_expires_at": None,
        "updated_at": now,
        "finished_at": now if status != "paused" else None,
    }
    if error is not None:
        values.update(_error_values(error))
    if _fence(session, job_id, lease_token, values) is None:
        return False
    message = {
        "succeeded": "Job succeeded",
        "failed": f"Job failed: {error.message}" if error else "Job failed",
        "cancelled": "Job cancelled",
        "paused": "Job paused after a checkpoint",
    }[status]
    append_event(
        session,
        job_id,
        f"job.{status}",
        message,
        level="error" if status == "failed" else "info",
        data={"error": _error_dict(error)} if error else None,
    )
    return True


def retry_job(
    session: Session,
    job_id: str,
    lease_token: str,
    error: JobError,
    *,
    infrastructure: bool = False,
    now: datetime | None = None,
) -> str | None:
    """After a system error: `recovering` (re-send it; it resumes from the latest checkpoint) while the job's
    budgets last, else `failed`. Returns the new status, or None when the lease is lost.

    A trainer crash spends the crash budget (failures; the job fails at the max_attempts-th). An
    infrastructure failure (`infrastructure`: the trainer killed from outside) spends the lost-worker budget
    (lost_workers; fails at the max_lost_workers-th). Both extend the crash streak when the job got no
    further than at its previous failure; a streak of CRASH_LOOP_STREAK fails the job at once, code
    `crash_loop`, naming the step and quoting `error.message` (the trainer's last error lines).
    User errors are never retried: call finish_job(..., "failed", error=...) for those."""
    if error.category != "system":
        raise ValueError("only system errors are retried")
    now = now or utcnow()
    job = session.execute(
        sa.select(
            Job.failures,
            Job.max_attempts,
            Job.lost_workers,
            Job.max_lost_workers,
            Job.crash_streak,
            Job.crash_step,
            Job.current_step,
        ).where(Job.id == job_id, Job.lease_token == lease_token)
    ).one_or_none()
    if job is None:
        return None
    streak = crash_streak_after(job.crash_streak, job.crash_step, job.current_step)
    if infrastructure:
        spent: dict[str, Any] = {"lost_workers": Job.lost_workers + 1}
        left = job.max_lost_workers - job.lost_workers - 1
    else:
        spent = {"failures": Job.failures + 1}
        left = job.max_attempts - job.failures - 1
    final = error
    if streak >= CRASH_LOOP_STREAK:
        final = JobError("crash_loop", crash_loop_message(streak, job.current_step, error.message), "system")
    exhausted = left <= 0 or final is not error
    values: dict[str, Any] = {
        "status": "failed" if exhausted else "recovering",
        **spent,
        "crash_streak": streak,
        "crash_step": job.current_step,
        "lease_token": None,
        "lease_expires_at": None,
        "updated_at": now,
        "finished_at": now if exhausted else None,
    }
    values.update(_error_values(final) if exhausted else {})
    if _fence(session, job_id, lease_token, values) is None:
        return None
    new_status = "failed" if exhausted else "recovering"
    budget = "lost-worker" if infrastructure else "crash"
    if final is not error:
        note = final.message
    elif exhausted:
        note = f"{error.message}; no attempts left ({budget} budget spent)"
    else:
        note = f"{error.message}; will resume from the latest checkpoint ({left} {budget} attempts left)"
    append_event(
        session,
        job_id,
        f"job.{new_status}",
        note,
        level="error" if exhausted else "warn",
        data={"error": _error_dict(final), "budget": budget, "attempts_left": left, "crash_streak": streak},
    )
    return new_status


def crash_streak_after(streak: int, crash_step: int | None, current_step: int) -> int:
    """The crash streak after one more failure at `current_step`: one more when the job got no further than
    at the previous failure (crash_step), else 1 (it made progress: a new streak)."""
    return streak + 1 if crash_step is not None and current_step <= crash_step else 1


def crash_loop_message(streak: int, step: int, last_error: str) -> str:
    return (
        f"the trainer failed {streak} times in a row at step {step + 1} (no attempt got past step {step}); "
        f"last: {last_error}"
    )[:1000]


def recover_stale_jobs(
    session: Session, *, stale_after_s: float, now: datetime | None = None, limit: int = 100
) -> list[tuple[str, str, str]]:
    """The sweeper's repair of jobs whose worker stopped heartbeating: running → recovering (or failed when
    the lost-worker budget is spent: lost_workers reaches max_lost_workers), pausing → paused, cancelling →
    cancelled. A lost worker is the infrastructure's fault: it spends neither the crash budget nor the
    crash streak. Returns (job id, queue, new status); re-send the `recovering` ones. Each change is
    conditional on the lease token seen, so a worker that heartbeats in between keeps its job."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=stale_after_s)
    candidates = session.execute(
        sa.select(Job.id, Job.queue, Job.status, Job.lease_token, Job.lost_workers, Job.max_lost_workers)
        .where(Job.status.in_(LEASED_STATUSES), Job.heartbeat_at < cutoff)
        .order_by(Job.heartbeat_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    changed: list[tuple[str, str, str]] = []
    for job in candidates:
        values: dict[str, Any] = {"lease_token": None, "lease_expires_at": None, "updated_at": now}
        lost = job.lost_workers + 1
        if job.status == "cancelling":
            values.update(status="cancelled", finished_at=now)
        elif job.status == "pausing":
            values.update(status="paused")
        elif lost >= job.max_lost_workers:
            error = JobError(
                "worker_lost",
                f"the worker stopped heartbeating; no attempts left ({lost} lost workers)",
                "system",
            )
            values.update(status="failed", lost_workers=lost, finished_at=now, **_error_values(error))
        else:
            values.update(status="recovering", lost_workers=lost)
        result = session.execute(
            sa.update(Job)
            .where(Job.id == job.id, Job.lease_token == job.lease_token, Job.heartbeat_at < cutoff)
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        if _rowcount(result) == 1:
            new_status = values["status"]
            append_event(
                session,
                job.id,
                f"job.{new_status}",
                f"Worker lost (no heartbeat for {stale_after_s:.0f} s); job {new_status}",
                level="warn" if new_status != "failed" else "error",
                data={"reason": "worker_lost", "lost_workers": values.get("lost_workers", job.lost_workers)},
            )
            changed.append((job.id, job.queue, new_status))
    return changed


def unclaimed_jobs(
    session: Session, *, older_than_s: float, now: datetime | None = None, limit: int = 100
) -> list[tuple[str, str]]:
    """(job id, queue) of queued/recovering jobs whose doorbell is older than `older_than_s` (or was never
    rung): the sweeper re-sends them and calls mark_enqueued."""
    cutoff = (now or utcnow()) - timedelta(seconds=older_than_s)
    rows = session.execute(
        sa.select(Job.id, Job.queue)
        .where(
            Job.status.in_(("queued", "recovering")),
            sa.or_(Job.enqueued_at.is_(None), Job.enqueued_at < cutoff),
        )
        .order_by(Job.id)
        .limit(limit)
    ).all()
    return [(row.id, row.queue) for row in rows]


# ---------------------------------------------------------------------------------------------- internals


def _newest_first_page(session: Session, query: Any, id_column: Any, after: str | None, limit: int) -> Any:
    """One page of a cursor-paginated listing, newest id first: (rows, has_more)."""
    if after is not None:
        query = query.where(id_column < after)
    rows = list(session.scalars(query.order_by(id_column.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def _fence(
    session: Session, job_id: str, lease_token: str, values: Mapping[str, Any], returning: Any = None
) -> Any:
    """UPDATE the job row if the lease holds; the RETURNING value (the id when not asked), or None."""
    column = returning if returning is not None else Job.id
    return session.execute(
        sa.update(Job)
        .where(Job.id == job_id, Job.lease_token == lease_token, Job.status.in_(LEASED_STATUSES))
        .values(**values)
        .returning(column)
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()


def _upsert(
    session: Session, model: Any, values: Mapping[str, Any], *, keys: Sequence[str], update: Sequence[str]
) -> None:
    dialect = session.get_bind().dialect.name
    insert: Any = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(model).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=list(keys), set_={name: getattr(stmt.excluded, name) for name in update}
    )
    session.execute(stmt)


def _error_values(error: JobError) -> dict[str, Any]:
    return {
        "error_code": error.code[:100],
        "error_message": error.message,
        "error_param": error.param[:255] if error.param else None,
        "error_category": error.category,
    }


def _error_dict(error: JobError | None) -> dict[str, Any] | None:
    if error is None:
        return None
    return {"code": error.code, "message": error.message, "param": error.param, "category": error.category}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _json_safe(value: Any) -> Any:
    """Plain JSON: non-finite floats become null, keys become strings, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)
