"""Helpers the repository modules share: pagination, the lease fence, upserts, JSON-safe values."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from store.models import LEASED_STATUSES, Job


def db_now(session: Session) -> datetime:
    """The database's clock (UTC): the one clock heartbeats are written and compared with, so a worker,
    sweeper or API host whose own clock is off cannot make a beat look fresh or stale. PostgreSQL: now() (the
    transaction's start); SQLite: the embedded host's clock, to the millisecond."""
    if session.get_bind().dialect.name == "sqlite":
        text = session.scalar(sa.text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')"))
        return datetime.fromisoformat(str(text)).replace(tzinfo=UTC)
    value = session.scalar(sa.select(sa.func.now()))
    assert isinstance(value, datetime)
    return value.astimezone(UTC) if value.tzinfo is not None else value.replace(tzinfo=UTC)


def newest_first_page(session: Session, query: Any, id_column: Any, after: str | None, limit: int) -> Any:
    """One page of a cursor-paginated listing, newest id first: (rows, has_more)."""
    if after is not None:
        query = query.where(id_column < after)
    rows = list(session.scalars(query.order_by(id_column.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def fence(
    session: Session, job_id: str, lease_token: str, values: Mapping[str, Any], returning: Any = None
) -> Any:
    """UPDATE the job row if the lease holds; the RETURNING value (the id when not asked), or None."""
    column = returning if returning is not None else Job.id
    return session.execute(
        sa.update(Job)
        .where(Job.id == job_id, Job.lease_token == lease_token, Job.status.in_(LEASED_STATUSES))
        .values(**values)
        .returning(column)
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()


def upsert(
    session: Session, model: Any, values: Mapping[str, Any], *, keys: Sequence[str], update: Sequence[str]
) -> None:
    dialect = session.get_bind().dialect.name
    insert: Any = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(model).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=list(keys), set_={name: getattr(stmt.excluded, name) for name in update}
    )
    session.execute(stmt)


def json_safe(value: Any) -> Any:
    """Plain JSON: non-finite floats become null, keys become strings, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)


def rowcount(result: Any) -> int:
    return int(result.rowcount)
