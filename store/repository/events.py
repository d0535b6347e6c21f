"""A job's event log: a per-job sequence, fenced writes for the worker, deduplicated retries."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from store.models import LEASED_STATUSES, Job, JobEvent, utcnow
from store.repository._common import json_safe


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
            data=json_safe(dict(data)) if data is not None else None,
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


# The job's first event (written with the job, store.repository.jobs.create_job); literals written into the
# SQL, as the statement pool binds only the named parameters.
_GRADER_WARNINGS = sa.select(JobEvent.data).where(
    JobEvent.job_id == sa.bindparam("job_id"),
    JobEvent.seq == sa.literal_column("1"),
    JobEvent.type == sa.literal_column("'job.created'"),
)


async def grader_warnings(pool: Any, job_id: str) -> list[dict[str, Any]] | None:
    """The loophole warnings a job with a grader got at submission (its first event's data), or None
    for a job without a grader check."""
    row = await pool.fetch_one(_GRADER_WARNINGS, {"job_id": job_id}, idempotent=True)
    data = row.get("data") if row else None
    if isinstance(data, str | bytes):  # the JSON as stored, where the driver hands it back as text
        data = json.loads(data)
    warnings = data.get("grader_warnings") if isinstance(data, dict) else None
    return warnings if isinstance(warnings, list) else None
