"""An index on a job's events by type (issue 46).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-07

The job view reads the latest event of each of a few types (samples, warnings) for one job
(store/repository/notes.py). With a step event per training step, a job holds thousands of events; the
index (job_id, type, seq) makes each of those reads one index probe instead of a scan of the job's events.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_job_events_job_id_type_seq", "job_events", ["job_id", "type", "seq"])


def downgrade() -> None:
    op.drop_index("ix_job_events_job_id_type_seq", table_name="job_events")
