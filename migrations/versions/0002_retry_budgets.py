"""Retry budgets: lost workers counted apart from trainer crashes, and a crash streak (issue 12).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

jobs.lost_workers (attempts lost to the infrastructure) and jobs.max_lost_workers (its budget, 10) next to
failures/max_attempts (trainer crashes); jobs.crash_streak and jobs.crash_step (failures in a row that got
no further than the one before, and that step) for the crash_loop rule. Server defaults fill the existing
rows: no lost worker so far, no streak. `failures` of a job that was already running may include lost
workers counted before this revision; it is left as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:  # batch: SQLite (the embedded mode) too
        batch.add_column(sa.Column("lost_workers", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("max_lost_workers", sa.Integer(), server_default="10", nullable=False))
        batch.add_column(sa.Column("crash_streak", sa.Integer(), server_default="0", nullable=False))
        batch.add_column(sa.Column("crash_step", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("crash_step")
        batch.drop_column("crash_streak")
        batch.drop_column("max_lost_workers")
        batch.drop_column("lost_workers")
