"""Checkpoint rows (the folders live in the artifact storage)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from store.models import Checkpoint


def list_checkpoints(session: Session, job_id: str) -> list[Checkpoint]:
    return list(
        session.scalars(sa.select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step))
    )


def get_checkpoint(session: Session, job_id: str, checkpoint_id: str) -> Checkpoint | None:
    return session.scalar(
        sa.select(Checkpoint).where(Checkpoint.id == checkpoint_id, Checkpoint.job_id == job_id)
    )


def latest_checkpoint(session: Session, job_id: str) -> Checkpoint | None:
    """The checkpoint to resume from: the latest row (a row exists only for a complete folder)."""
    return session.scalar(
        sa.select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step.desc()).limit(1)
    )


def set_checkpoint_archive(session: Session, checkpoint: Checkpoint, sha256: str, size: int) -> None:
    session.execute(
        sa.update(Checkpoint)
        .where(Checkpoint.id == checkpoint.id, Checkpoint.path == checkpoint.path)
        .values(archive_sha256=sha256, archive_bytes=size)
        .execution_options(synchronize_session=False)
    )
    checkpoint.archive_sha256, checkpoint.archive_bytes = sha256, size


def checkpoints_trimmed(session: Session, job_id: str, sizes: dict[int, int]) -> bool:
    """The job's checkpoints at these steps lost their training state (worker/retention.py): their new
    sizes; their archive digests are computed again at the next download."""
    for step, size in sizes.items():
        session.execute(
            sa.update(Checkpoint)
            .where(Checkpoint.job_id == job_id, Checkpoint.step == step)
            .values(bytes=size, archive_sha256=None, archive_bytes=None)
            .execution_options(synchronize_session=False)
        )
    return True
