"""The worker side (issue 5): claim a job, then write to it under the lease token.

claim_job, heartbeat, record_step_metrics, record_eval, add_checkpoint, remove_checkpoint, finish_job and
retry_job take the job's lease token and fence on it (see store.repository); recover_stale_jobs and
unclaimed_jobs are the sweeper's.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from contract.metrics import STEP_SECONDS
from contract.numbers import finite
from contract.protocol import FailureCode
from store.ids import new_id
from store.models import (
    CRASH_LOOP_STREAK,
    LEASED_STATUSES,
    Checkpoint,
    Job,
    JobEval,
    JobMetric,
    utcnow,
)
from store.repository._common import db_now, fence, json_safe, rowcount, upsert
from store.repository.checkpoints import latest_checkpoint
from store.repository.events import append_event

STEP_SECONDS_METRIC = STEP_SECONDS  # the catalogue's key (contract.metrics)
STEP_SECONDS_EMA_WEIGHT = 0.1


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
    now = now or db_now(session)  # the database's clock (store.repository._common.db_now)
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
        # Tenants read this event: the worker (host name, pid) stays in lease_owner and the worker's log.
        f"Attempt {row.attempt} started"
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
    )


def heartbeat(
    session: Session, job_id: str, lease_token: str, *, lease_s: float, now: datetime | None = None
) -> str | None:
    """Extend the lease. Returns the job's status ("running", or "cancelling"/"pausing": stop cooperatively),
    or None when the lease is lost (stop at once, write nothing more)."""
    now = now or db_now(session)  # the database's clock (store.repository._common.db_now)
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
    clean = json_safe(dict(metrics))
    step_seconds = finite(clean.get(STEP_SECONDS_METRIC))
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
    attempt = fence(session, job_id, lease_token, values, returning=Job.attempt)
    if attempt is None:
        return False
    upsert(
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
    if fence(session, job_id, lease_token, {"updated_at": now}) is None:
        return False
    upsert(
        session,
        JobEval,
        {"job_id": job_id, "step": step, "metrics": json_safe(dict(metrics)), "created_at": now},
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
    if fence(session, job_id, lease_token, {"updated_at": now}) is None:
        return None
    upsert(
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
    if fence(session, job_id, lease_token, {"updated_at": now}) is None:
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
    if fence(session, job_id, lease_token, values) is None:
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

    A trainer crash spends the crash budget (failures; fails at the max_attempts-th), an infrastructure
    failure (`infrastructure`: the trainer killed from outside) the lost-worker budget (lost_workers).
    Both extend the crash streak when the failed attempt completed no step, else start a new one (N15: a
    resume redoes the steps after its checkpoint, so an attempt killed at 12 after resuming from 10 was
    progressing); a streak of CRASH_LOOP_STREAK fails the job at once, code `crash_loop`.
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
            Job.attempt,
        ).where(Job.id == job_id, Job.lease_token == lease_token)
    ).one_or_none()
    if job is None:
        return None
    furthest = furthest_step(session, job_id, job.current_step)
    streak = crash_streak_after(job.crash_streak, completed_a_step(session, job_id, job.attempt))
    if infrastructure:
        spent: dict[str, Any] = {"lost_workers": Job.lost_workers + 1}
        left = job.max_lost_workers - job.lost_workers - 1
    else:
        spent = {"failures": Job.failures + 1}
        left = job.max_attempts - job.failures - 1
    final = _crash_loop(session, job_id, streak, furthest, error)
    exhausted = left <= 0 or final is not error
    values: dict[str, Any] = {
        "status": "failed" if exhausted else "recovering",
        **spent,
        "crash_streak": streak,
        "crash_step": furthest,
        "lease_token": None,
        "lease_expires_at": None,
        "updated_at": now,
        "finished_at": now if exhausted else None,
    }
    values.update(_error_values(final) if exhausted else {})
    if fence(session, job_id, lease_token, values) is None:
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


def furthest_step(session: Session, job_id: str, current_step: int) -> int:
    """The furthest step any attempt of the job reached: its highest metric row (rows are kept when a resume
    redoes steps), or the job's current step when that is higher."""
    recorded = session.scalar(sa.select(sa.func.max(JobMetric.step)).where(JobMetric.job_id == job_id))
    return max(current_step, recorded or 0)


def _crash_loop(session: Session, job_id: str, streak: int, furthest: int, error: JobError) -> JobError:
    """The crash_loop error a streak of CRASH_LOOP_STREAK becomes, else `error` itself."""
    if streak < CRASH_LOOP_STREAK:
        return error
    message = crash_loop_message(streak, resumed_from(session, job_id), furthest, error.message)
    return JobError(FailureCode.CRASH_LOOP, message, "system")


def completed_a_step(session: Session, job_id: str, attempt: int) -> bool:
    """Whether `attempt` recorded a step: a resumed attempt redoes only the steps after its checkpoint, so
    any row it wrote is a step past the one it started from."""
    row = session.scalar(
        sa.select(JobMetric.step).where(JobMetric.job_id == job_id, JobMetric.attempt == attempt).limit(1)
    )
    return row is not None


def resumed_from(session: Session, job_id: str) -> int:
    """The step an attempt that completed no step resumed from: the latest checkpoint's, or 0."""
    latest = latest_checkpoint(session, job_id)
    return latest.step if latest is not None else 0


def crash_streak_after(streak: int, progressed: bool) -> int:
    """The crash streak after one more failure: 1 when the failed attempt completed a step (progress: a
    new streak), else one more."""
    return 1 if progressed else streak + 1


def crash_loop_message(streak: int, resumed: int, furthest: int, last_error: str) -> str:
    return (
        f"the trainer failed {streak} times in a row and the last attempt completed no step: it resumed from "
        f"step {resumed} and failed before finishing step {resumed + 1} (the furthest step any attempt "
        f"reached: {furthest}); last: {last_error}"
    )[:1000]


def recover_stale_jobs(
    session: Session, *, stale_after_s: float, now: datetime | None = None, limit: int = 100
) -> list[tuple[str, str, str]]:
    """The sweeper's repair of jobs whose worker stopped heartbeating: running → recovering (or failed when
    the lost-worker budget is spent: lost_workers reaches max_lost_workers), pausing → paused, cancelling →
    cancelled. A lost worker is the infrastructure's fault: it spends neither the crash budget nor the
    crash streak. Returns (job id, queue, new status); re-send the `recovering` ones. Each change is
    conditional on the lease token seen, so a worker that heartbeats in between keeps its job."""
    now = now or db_now(session)  # the database's clock (store.repository._common.db_now)
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
                FailureCode.WORKER_LOST,
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
        if rowcount(result) == 1:
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
