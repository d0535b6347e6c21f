"""Uploaded datasets (the rows; the bytes live in the artifact storage, store.artifacts)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from store.async_pool import StatementPool
from store.errors import Conflict
from store.models import ACTIVE_STATUSES, File, Job, utcnow
from store.repository._common import newest_first_page

_GET_FILE = sa.select(*(c.label(a.key) for a in File.__mapper__.column_attrs for c in a.columns)).where(
    File.id == sa.bindparam("file_id"), File.tenant_id == sa.bindparam("tenant_id")
)


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


async def get_file(pool: StatementPool, tenant_id: str, file_id: str) -> SimpleNamespace | None:
    """The tenant's file row as a read-only object (the columns by attribute name), or None; awaited on the
    database's event-loop pool."""
    row = await pool.fetch_one(_GET_FILE, {"tenant_id": tenant_id, "file_id": file_id}, idempotent=True)
    return SimpleNamespace(**row) if row is not None else None


def list_files(
    session: Session, tenant_id: str, *, after: str | None, limit: int, purpose: str | None = None
) -> tuple[list[File], bool]:
    query = sa.select(File).where(File.tenant_id == tenant_id)
    if purpose is not None:
        query = query.where(File.purpose == purpose)
    return newest_first_page(session, query, File.id, after, limit)


def delete_file(session: Session, file: Any) -> None:
    """Delete the tenant's file row (`file`: a File or get_file's object); 409 while a job that has not
    finished reads the file."""
    user = session.scalar(
        sa.select(Job.id).where(Job.training_file_id == file.id, Job.status.in_(ACTIVE_STATUSES)).limit(1)
    )
    if user is not None:
        raise Conflict(f"file {file.id} is used by job {user}, which has not finished", code="file_in_use")
    session.execute(sa.delete(File).where(File.id == file.id, File.tenant_id == file.tenant_id))
