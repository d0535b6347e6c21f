"""Read-only queries of the fleet exporter (worker/metrics.py): failed jobs by error code, and the latest
evaluation of the active jobs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from store.models import Job, JobEval


def failed_job_counts(session: Session) -> list[tuple[str, str, int]]:
    """(error code, queue, count) of the jobs whose status is failed; a missing code reads "unknown"."""
    code = sa.func.coalesce(Job.error_code, "unknown")
    rows = session.execute(
        sa.select(code, Job.queue, sa.func.count(Job.id))
        .where(Job.status == "failed")
        .group_by(code, Job.queue)
    ).all()
    return [(str(c), str(queue), int(count)) for c, queue, count in rows]


def latest_evals(session: Session, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """job id → the metrics of its latest evaluation (highest step), for the jobs that have one."""
    if not job_ids:
        return {}
    latest = (
        sa.select(JobEval.job_id, sa.func.max(JobEval.step).label("step"))
        .where(JobEval.job_id.in_(list(job_ids)))
        .group_by(JobEval.job_id)
        .subquery()
    )
    rows = session.execute(
        sa.select(JobEval.job_id, JobEval.metrics).join(
            latest, sa.and_(JobEval.job_id == latest.c.job_id, JobEval.step == latest.c.step)
        )
    ).all()
    return {str(job_id): dict(metrics or {}) for job_id, metrics in rows}
