"""A job's spec kept as written (issue 32, N8).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03

jobs.spec and jobs.resolved_spec become PostgreSQL `json` (the text as written) instead of `jsonb`. JSONB
stores numbers as numeric and writes them back in its own spelling: a float of 1e+70 came back as a 71-digit
integer, which the trainer's document rules refuse, so a spec the API had accepted failed in the trainer.
`json` hands back the text the API wrote (the validated spec's JSON), so the trainer reads the numbers the
API validated. Nothing queries inside these columns. SQLite already stores JSON as text: no change there.
The conversion keeps each row's value (already in JSONB's spelling for rows written before).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("spec", "resolved_spec")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for column in COLUMNS:
        op.alter_column(
            "jobs",
            column,
            type_=postgresql.JSON(),
            existing_type=postgresql.JSONB(astext_type=sa.Text()),
            existing_nullable=False,
            postgresql_using=f"{column}::json",
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for column in COLUMNS:
        op.alter_column(
            "jobs",
            column,
            type_=postgresql.JSONB(astext_type=sa.Text()),
            existing_type=postgresql.JSON(),
            existing_nullable=False,
            postgresql_using=f"{column}::jsonb",
        )
