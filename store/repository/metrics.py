"""A job's step metrics and evals, and its history as the trainer's event stream (for the report)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from store.models import Job, JobEval, JobMetric
from store.repository.checkpoints import list_checkpoints
from store.repository.notes import sample_events, warning_events


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
    events += sample_events(session, job.id) + warning_events(session, job.id)
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
