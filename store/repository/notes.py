"""What a job's view shows beside its metrics, read from its events: the warnings given at submission (the
first event's data), the latest warning of each kind the trainer reported (`warning.<kind>` events) and the
latest samples of each phase (`samples.eval`, `samples.train`), in one transaction (one round trip on
PostgreSQL), and every samples event for the report. Events the worker writes: worker/records.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from contract.samples import PHASES, checked_samples
from contract.warnings import TRAINING_KINDS
from store.models import JobEvent

SAMPLE_TYPES = tuple(f"samples.{phase}" for phase in PHASES)
WARNING_PREFIX = "warning."
WARNING_TYPES = tuple(WARNING_PREFIX + kind for kind in TRAINING_KINDS)

# The first event (job.created, written with the job): literals in the SQL, as the pool binds named params.
_FIRST = sa.select(JobEvent.data).where(
    JobEvent.job_id == sa.bindparam("job_id"), JobEvent.seq == sa.literal_column("1")
)


def _latest(index: int, event_type: str) -> sa.Select[Any]:
    """The latest event of a type (one of ours: written into the SQL); its own parameter name, as the
    statements of one transaction share one parameter namespace (store.async_pool)."""
    return (
        sa.select(JobEvent.type, JobEvent.message, JobEvent.step, JobEvent.data)
        .where(
            JobEvent.job_id == sa.bindparam(f"job_id_{index}"),
            JobEvent.type == sa.literal_column(f"'{event_type}'"),
        )
        .order_by(JobEvent.seq.desc())
        .limit(sa.literal_column("1"))
    )


_LATEST = tuple(_latest(i, t) for i, t in enumerate((*SAMPLE_TYPES, *WARNING_TYPES)))


@dataclass
class JobNotes:
    """The warnings and samples of one job, as the job view shows them."""

    submitted: dict[str, Any] = field(default_factory=dict)  # the first event's data
    warnings: list[dict[str, Any]] = field(default_factory=list)  # at submission, then the trainer's
    samples: dict[str, dict[str, Any]] = field(default_factory=dict)  # phase -> {step, samples}

    @property
    def grader_warnings(self) -> list[dict[str, Any]] | None:
        found = self.submitted.get("grader_warnings")
        return found if isinstance(found, list) else None


def _data(row: dict[str, Any] | None) -> dict[str, Any]:
    data = row.get("data") if row else None
    if isinstance(data, str | bytes):  # the JSON as stored, where the driver hands it back as text
        data = json.loads(data)
    return data if isinstance(data, dict) else {}


def training_warning(message: str, data: dict[str, Any]) -> dict[str, Any]:
    """A `warning.<kind>` event's warning as the API shows it."""

    def whole(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return {
        "kind": data.get("kind"),
        "message": message,
        "step": whole(data.get("step")),
        "count": whole(data.get("count")) or 1,
        "first_step": whole(data.get("first_step")),
    }


async def job_notes(pool: Any, job_id: str) -> JobNotes:
    """The job's notes (JobNotes) in one transaction."""
    steps = [(_FIRST, {"job_id": job_id}), *((q, {f"job_id_{i}": job_id}) for i, q in enumerate(_LATEST))]
    first, *latest = await pool.fetch_in_transaction(steps)
    notes = JobNotes(submitted=_data(first))
    given = notes.submitted.get("warnings")
    notes.warnings = list(given) if isinstance(given, list) else []
    for row in latest:
        if row is None:
            continue
        kind, data = str(row["type"]), _data(row)
        if kind in SAMPLE_TYPES:
            if isinstance(data.get("step"), int):
                entry = {"step": data["step"], "samples": checked_samples(data.get("samples"))}
                notes.samples[kind.removeprefix("samples.")] = entry
        else:
            notes.warnings.append(training_warning(str(row["message"]), data))
    return notes


def sample_events(session: Session, job_id: str) -> list[dict[str, Any]]:
    """Every samples event of the job, oldest first, as the trainer wrote them (for the report)."""
    rows = session.execute(
        sa.select(JobEvent.data)
        .where(JobEvent.job_id == job_id, JobEvent.type.in_(SAMPLE_TYPES))
        .order_by(JobEvent.seq)
    )
    return [{"type": "samples", **data} for (data,) in rows if isinstance(data, dict)]


def warning_events(session: Session, job_id: str) -> list[dict[str, Any]]:
    """Every trainer warning of the job, oldest first, as the trainer wrote them (for the report)."""
    rows = session.execute(
        sa.select(JobEvent.message, JobEvent.data)
        .where(JobEvent.job_id == job_id, JobEvent.type.in_(WARNING_TYPES))
        .order_by(JobEvent.seq)
    )
    return [
        {"type": "warning", **training_warning(message, data)}
        for message, data in rows
        if isinstance(data, dict)
    ]
