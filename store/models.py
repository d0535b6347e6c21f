"""Database tables (SQLAlchemy 2). The schema's history lives in migrations/; `alembic check` keeps the two equal.

Tenancy: tenants own api_keys, files and jobs (each carries tenant_id); a job's events, metrics, evals and
checkpoints are reached only through the job. Job status is a VARCHAR with a CHECK constraint rather than
a native enum, so a new state is a one-line migration.

Worker-facing columns on jobs: lease_token (the fencing token of the claim), lease_owner, lease_expires_at,
heartbeat_at, attempt, the retry budgets (below), enqueued_at (last doorbell), event_seq (the per-job event
counter), current_step/last_metrics/step_seconds_ema (a snapshot of the latest step, so reading a job is one
row).

Retry budgets (repository.retry_job and recover_stale_jobs spend them): `failures` counts attempts that
ended in a trainer crash, and the job fails at the max_attempts-th; `lost_workers` counts attempts lost to
the infrastructure (a worker that stopped heartbeating, a trainer SIGKILLed from outside), and the job fails
at the max_lost_workers-th; `crash_streak` counts failures in a row whose attempt completed no step (no
further than the checkpoint it resumed from; `crash_step` keeps the furthest step any attempt reached), and
the job fails (crash_loop) at CRASH_LOOP_STREAK. A
storage fault or a user error fails the job at once and spends none of them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal, get_args

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JobStatus = Literal[
    "validating",
    "queued",
    "running",
    "pausing",
    "paused",
    "recovering",
    "cancelling",
    "cancelled",
    "succeeded",
    "failed",
]
JOB_STATUSES: tuple[str, ...] = get_args(JobStatus)
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
# States in which a worker holds (or held) the lease and writes to the job.
LEASED_STATUSES = ("running", "pausing", "cancelling")
ACTIVE_STATUSES = tuple(s for s in JOB_STATUSES if s not in TERMINAL_STATUSES)
# States in which a job waits for a worker of its queue to take it (first run, or again after a lost worker).
WAITING_STATUSES = ("queued", "recovering")

FILE_PURPOSES = ("rl_train", "rl_eval")
ERROR_CATEGORIES = ("user", "system")
DEFAULT_MAX_LOST_WORKERS = 10  # lost workers a job survives: node failures and preemptions are not its fault
CRASH_LOOP_STREAK = 2  # failures in a row, the last completing no step, that end the job (crash_loop)
EVENT_LEVELS = ("info", "warn", "error")


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite hands back naive values)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
JSONText = sa.JSON()
"""JSON kept as written: PostgreSQL's `json` (the text itself; JSONB would respell 1e+70 as a 71-digit
integer) and SQLite's JSON text. A job's spec is stored in it, so the trainer reads back the very numbers
the API validated (contract/spec.py, "Numeric bounds")."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def _in(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(sa.String(200))
    prefix: Mapped[str] = mapped_column(sa.String(32), unique=True)  # lookup; the full key is never stored
    key_hash: Mapped[str] = mapped_column(sa.String(64))  # sha256 hex of the full key
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class File(Base):
    __tablename__ = "files"
    __table_args__ = (
        sa.CheckConstraint(f"purpose IN ({_in(FILE_PURPOSES)})", name="purpose"),
        sa.Index("ix_files_tenant_id_id", "tenant_id", "id"),
    )

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(sa.String(255))
    purpose: Mapped[str] = mapped_column(sa.String(20))
    bytes: Mapped[int] = mapped_column(sa.BigInteger())
    sha256: Mapped[str] = mapped_column(sa.String(64))
    records: Mapped[int] = mapped_column(sa.Integer())
    storage_key: Mapped[str] = mapped_column(sa.String(512))  # relative to the artifact root
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        sa.CheckConstraint(f"status IN ({_in(JOB_STATUSES)})", name="status"),
        sa.CheckConstraint(
            f"error_category IS NULL OR error_category IN ({_in(ERROR_CATEGORIES)})", name="error_category"
        ),
        sa.UniqueConstraint("tenant_id", "idempotency_key"),
        sa.Index("ix_jobs_tenant_id_id", "tenant_id", "id"),
        sa.Index("ix_jobs_tenant_id_status_id", "tenant_id", "status", "id"),
        sa.Index("ix_jobs_status_heartbeat_at", "status", "heartbeat_at"),
    )

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(sa.ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str | None] = mapped_column(sa.String(200))
    status: Mapped[str] = mapped_column(sa.String(20))
    spec: Mapped[dict[str, Any]] = mapped_column(JSONText)  # as submitted
    resolved_spec: Mapped[dict[str, Any]] = mapped_column(JSONText)  # every default filled in (validated)
    spec_hash: Mapped[str] = mapped_column(sa.String(64))
    model: Mapped[str] = mapped_column(sa.String(512))
    algorithm: Mapped[str] = mapped_column(sa.String(64))
    queue: Mapped[str] = mapped_column(sa.String(100))
    training_file_id: Mapped[str | None] = mapped_column(
        sa.ForeignKey("files.id", ondelete="SET NULL"), index=True
    )
    job_metadata: Mapped[dict[str, str]] = mapped_column("metadata", JSONType)
    run_dir: Mapped[str] = mapped_column(sa.String(512))  # the trainer's OUT, relative to the artifact root

    total_steps: Mapped[int] = mapped_column(sa.Integer())
    current_step: Mapped[int] = mapped_column(sa.Integer(), default=0)
    last_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    last_step_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    step_seconds_ema: Mapped[float | None] = mapped_column(sa.Float())

    attempt: Mapped[int] = mapped_column(sa.Integer(), default=0)  # claims so far (pause/resume counts)
    failures: Mapped[int] = mapped_column(sa.Integer(), default=0)  # attempts ended by a trainer crash
    max_attempts: Mapped[int] = mapped_column(sa.Integer())  # the crash budget: fails at this many crashes
    lost_workers: Mapped[int] = mapped_column(sa.Integer(), default=0, server_default="0")
    max_lost_workers: Mapped[int] = mapped_column(
        sa.Integer(), default=DEFAULT_MAX_LOST_WORKERS, server_default=str(DEFAULT_MAX_LOST_WORKERS)
    )
    crash_streak: Mapped[int] = mapped_column(sa.Integer(), default=0, server_default="0")
    crash_step: Mapped[int | None] = mapped_column(sa.Integer())  # job.current_step at the last failure
    lease_token: Mapped[str | None] = mapped_column(sa.String(64))
    lease_owner: Mapped[str | None] = mapped_column(sa.String(255))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    enqueued_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    event_seq: Mapped[int] = mapped_column(sa.Integer(), default=0)

    idempotency_key: Mapped[str | None] = mapped_column(sa.String(255))
    request_hash: Mapped[str | None] = mapped_column(sa.String(64))

    error_code: Mapped[str | None] = mapped_column(sa.String(100))
    error_message: Mapped[str | None] = mapped_column(sa.Text())
    error_param: Mapped[str | None] = mapped_column(sa.String(255))
    error_category: Mapped[str | None] = mapped_column(sa.String(10))

    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class JobEvent(Base):
    __tablename__ = "job_events"
    __table_args__ = (
        sa.CheckConstraint(f"level IN ({_in(EVENT_LEVELS)})", name="level"),
        sa.UniqueConstraint("job_id", "dedupe_key"),
        # the latest event of a type for one job (the job view's samples and warnings; migration 0005)
        sa.Index("ix_job_events_job_id_type_seq", "job_id", "type", "seq"),
    )

    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(sa.Integer(), primary_key=True, autoincrement=False)
    type: Mapped[str] = mapped_column(sa.String(64))
    level: Mapped[str] = mapped_column(sa.String(10))
    message: Mapped[str] = mapped_column(sa.Text())
    step: Mapped[int | None] = mapped_column(sa.Integer())
    data: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    dedupe_key: Mapped[str | None] = mapped_column(sa.String(200))  # lets a retried write be a no-op
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class JobMetric(Base):
    """One training step's metrics (unique per job and step; a redone step overwrites its row)."""

    __tablename__ = "job_metrics"

    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(sa.Integer(), primary_key=True, autoincrement=False)
    attempt: Mapped[int] = mapped_column(sa.Integer())
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class JobEval(Base):
    """One evaluation's results (avg@k, pass@k, ...) at a step (unique per job and step)."""

    __tablename__ = "job_evals"

    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(sa.Integer(), primary_key=True, autoincrement=False)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Checkpoint(Base):
    """A complete checkpoint folder (the row is inserted only after the folder was renamed into place)."""

    __tablename__ = "checkpoints"
    __table_args__ = (sa.UniqueConstraint("job_id", "step"),)

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    job_id: Mapped[str] = mapped_column(sa.ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(sa.Integer())
    path: Mapped[str] = mapped_column(sa.String(1024))  # relative to the artifact root
    bytes: Mapped[int | None] = mapped_column(sa.BigInteger())  # sum of the files' sizes
    archive_sha256: Mapped[str | None] = mapped_column(sa.String(64))  # of the download's tar stream
    archive_bytes: Mapped[int | None] = mapped_column(sa.BigInteger())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Worker(Base):
    """The worker registry: one row per worker process and queue it consumes, with what it can run
    (contract.fleet.WorkerClass as JSON) and its last heartbeat. A row whose heartbeat is older than the
    service's worker_stale_after_s no longer counts; a worker that stops cleanly deletes its rows."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(sa.String(255), primary_key=True)  # the Celery hostname
    queue: Mapped[str] = mapped_column(sa.String(100), primary_key=True)
    capabilities: Mapped[dict[str, Any]] = mapped_column(JSONType)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
