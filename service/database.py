"""Engines and sessions. PostgreSQL (psycopg 3) in production; SQLite (WAL + busy_timeout) in embedded mode."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.async_pool import AsyncPool, connection_looks_alive

SQLITE_BUSY_TIMEOUT_MS = 10_000


def make_engine(url: str, *, pool_size: int = 20) -> Engine:
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 10})
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    engine = sa.create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=10,
        pool_recycle=1800,
        pool_pre_ping=False,  # the checkout check below finds dead connections without a round trip
    )
    sa.event.listen(engine, "checkout", _check_alive)
    return engine


def _check_alive(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """A pooled connection the server closed (a restart, an idle timeout) is replaced at checkout: the
    pool catches DisconnectionError and connects anew, so no request fails once PostgreSQL is back."""
    if not connection_looks_alive(dbapi_connection):
        raise sa.exc.DisconnectionError("the server closed this pooled connection")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


class Database:
    """An engine, its session factory, and an autocommit view of the engine for single-statement reads.
    `with db.transaction() as session:` commits or rolls back."""

    def __init__(self, url: str, *, pool_size: int = 20, async_pool: bool = False) -> None:
        self.engine = make_engine(url, pool_size=pool_size)
        # PostgreSQL only: the hot paths (read a job, create a job) run on the event loop (service.async_pool).
        self.async_pool = (
            AsyncPool(url, size=min(pool_size, 16)) if async_pool and not url.startswith("sqlite") else None
        )
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        # Same pool, no transaction: one round trip for a single-statement read (no BEGIN, no ROLLBACK).
        self.reader = self.engine.execution_options(isolation_level="AUTOCOMMIT")

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        with self.sessions() as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()

    async def aclose(self) -> None:
        if self.async_pool is not None:
            await self.async_pool.close()
