"""Initial schema: tenants, api keys, files, jobs, job events, per-step metrics, evals, checkpoints.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Works on PostgreSQL (JSONB, timestamptz) and SQLite (JSON text, ISO timestamps). Job status is a VARCHAR
with a CHECK constraint, not a native enum, so adding a state is a one-line migration.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    _create_tenants_and_api_keys()
    _create_files()
    _create_jobs()
    _create_job_records()


def _create_tenants_and_api_keys() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prefix", sa.String(length=32), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("last_used_at", TIMESTAMP, nullable=True),
        sa.Column("revoked_at", TIMESTAMP, nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("prefix", name=op.f("uq_api_keys_prefix")),
    )
    op.create_index(op.f("ix_api_keys_tenant_id"), "api_keys", ["tenant_id"], unique=False)


def _create_files() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("purpose", sa.String(length=20), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("records", sa.Integer(), nullable=False),
        sa.Column("storage_key", sa.String(length=512), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint("purpose IN ('rl_train', 'rl_eval')", name=op.f("ck_files_purpose")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_files_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_files")),
    )
    op.create_index("ix_files_tenant_id_id", "files", ["tenant_id", "id"], unique=False)


def _create_jobs() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("resolved_spec", JSON, nullable=False),
        sa.Column("spec_hash", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=512), nullable=False),
        sa.Column("algorithm", sa.String(length=64), nullable=False),
        sa.Column("queue", sa.String(length=100), nullable=False),
        sa.Column("training_file_id", sa.String(length=40), nullable=True),
        sa.Column("metadata", JSON, nullable=False),
        sa.Column("run_dir", sa.String(length=512), nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=False),
        sa.Column("current_step", sa.Integer(), nullable=False),
        sa.Column("last_metrics", JSON, nullable=True),
        sa.Column("last_step_at", TIMESTAMP, nullable=True),
        sa.Column("step_seconds_ema", sa.Float(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("lease_token", sa.String(length=64), nullable=True),
        sa.Column("lease_owner", sa.String(length=255), nullable=True),
        sa.Column("lease_expires_at", TIMESTAMP, nullable=True),
        sa.Column("heartbeat_at", TIMESTAMP, nullable=True),
        sa.Column("enqueued_at", TIMESTAMP, nullable=True),
        sa.Column("event_seq", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        sa.Column("error_code", sa.String(length=100), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("error_param", sa.String(length=255), nullable=True),
        sa.Column("error_category", sa.String(length=10), nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.Column("started_at", TIMESTAMP, nullable=True),
        sa.Column("finished_at", TIMESTAMP, nullable=True),
        sa.CheckConstraint(
            "error_category IS NULL OR error_category IN ('user', 'system')",
            name=op.f("ck_jobs_error_category"),
        ),
        sa.CheckConstraint(
            "status IN ('validating', 'queued', 'running', 'pausing', 'paused', 'recovering', 'cancelling', "
            "'cancelled', 'succeeded', 'failed')",
            name=op.f("ck_jobs_status"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_jobs_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["training_file_id"],
            ["files.id"],
            name=op.f("fk_jobs_training_file_id_files"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("tenant_id", "idempotency_key", name=op.f("uq_jobs_tenant_id_idempotency_key")),
    )
    op.create_index("ix_jobs_status_heartbeat_at", "jobs", ["status", "heartbeat_at"], unique=False)
    op.create_index("ix_jobs_tenant_id_id", "jobs", ["tenant_id", "id"], unique=False)
    op.create_index("ix_jobs_tenant_id_status_id", "jobs", ["tenant_id", "status", "id"], unique=False)
    op.create_index(op.f("ix_jobs_training_file_id"), "jobs", ["training_file_id"], unique=False)


def _create_job_records() -> None:
    """A job's checkpoints, evaluations, events and per-step metrics."""
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=True),
        sa.Column("archive_sha256", sa.String(length=64), nullable=True),
        sa.Column("archive_bytes", sa.BigInteger(), nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_checkpoints_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
        sa.UniqueConstraint("job_id", "step", name=op.f("uq_checkpoints_job_id_step")),
    )
    op.create_table(
        "job_evals",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("step", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("metrics", JSON, nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_evals_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "step", name=op.f("pk_job_evals")),
    )
    op.create_table(
        "job_events",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("level", sa.String(length=10), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("data", JSON, nullable=True),
        sa.Column("dedupe_key", sa.String(length=200), nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint("level IN ('info', 'warn', 'error')", name=op.f("ck_job_events_level")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_events_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "seq", name=op.f("pk_job_events")),
        sa.UniqueConstraint("job_id", "dedupe_key", name=op.f("uq_job_events_job_id_dedupe_key")),
    )
    op.create_table(
        "job_metrics",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("step", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("metrics", JSON, nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_metrics_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "step", name=op.f("pk_job_metrics")),
    )


def downgrade() -> None:
    op.drop_table("job_metrics")
    op.drop_table("job_events")
    op.drop_table("job_evals")
    op.drop_table("checkpoints")
    op.drop_index(op.f("ix_jobs_training_file_id"), table_name="jobs")
    op.drop_index("ix_jobs_tenant_id_status_id", table_name="jobs")
    op.drop_index("ix_jobs_tenant_id_id", table_name="jobs")
    op.drop_index("ix_jobs_status_heartbeat_at", table_name="jobs")
    op.drop_table("jobs")
    op.drop_index("ix_files_tenant_id_id", table_name="files")
    op.drop_table("files")
    op.drop_index(op.f("ix_api_keys_tenant_id"), table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("tenants")
