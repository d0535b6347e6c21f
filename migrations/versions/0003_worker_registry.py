"""The worker registry (issue 23, placement that knows the fleet).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02

workers: one row per worker process and queue it consumes (id = its Celery hostname), what it can run
(contract.fleet.WorkerClass as JSON: strategies, nodes, processes per node, memory per device, device
kind, rollout engines) and its last heartbeat. The service counts rows whose heartbeat is recent
(STARE_WORKER_STALE_AFTER_S) besides the declared classes (STARE_WORKER_CLASSES).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.String(255), nullable=False),
        sa.Column("queue", sa.String(100), nullable=False),
        sa.Column("capabilities", JSON, nullable=False),
        sa.Column("started_at", TIMESTAMP, nullable=False),
        sa.Column("heartbeat_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", "queue", name=op.f("pk_workers")),
    )
    op.create_index(op.f("ix_workers_heartbeat_at"), "workers", ["heartbeat_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_workers_heartbeat_at"), table_name="workers")
    op.drop_table("workers")
