"""Uploaded datasets (the rows; the bytes live in the artifact storage)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from store.errors import Conflict
from store.models import ACTIVE_STATUSES, File, Job, utcnow
from store.repository._common import newest_first_page


def create_file(
    session: Session,
    *,
    file_id: str,
    tenant_id: str,
    filename: str,
    purpose: str,
    size: int,
    sha256: str,
    records: int,
    storage_key: str,
) -> File:
    row = File(
        id=file_id,
        tenant_id=tenant_id,
        filename=filename,
        purpose=purpose,
        bytes=size,
        sha256=sha256,
        records=records,
        storage_key=storage_key,
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row


def get_file(session: Session, tenant_id: str, file_id: str) -> File | None:
    return session.scalar(sa.select(File).where(File.id == file_id, File.tenant_id == tenant_id))


def list_files(
    session: Session, tenant_id: str, *, after: str | None, limit: int, purpose: str | None = None
) -> tuple[list[File], bool]:
    query = sa.select(File).where(File.tenant_id == tenant_id)
    if purpose is not None:
        query = query.where(File.purpose == purpose)
    return newest_first_page(session, query, File.id, after, limit)


def delete_file(session: Session, file: File) -> None:
    """Delete the row; 409 while a job that has not finished reads the file."""
    user = session.scalar(
        sa.select(Job.id).where(Job.training_file_id == file.id, Job.status.in_(ACTIVE_STATUSES)).limit(1)
    )
    if user is not None:
        raise Conflict(f"file {file.id} is used by job {user}, which has not finished", code="file_in_use")
    session.delete(file)
    session.flush()
