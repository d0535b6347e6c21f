"""Engines and sessions. PostgreSQL (psycopg 3) in production; SQLite (WAL + busy_timeout) in embedded mode."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from store.async_pool import AsyncPool, ThreadedPool, connection_looks_alive

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
    """An engine, its session factory, and the pool the event loop awaits single statements on
    (`async_pool`: psycopg's on PostgreSQL, the engine's in a thread on SQLite).
    `with db.transaction() as session:` commits or rolls back."""

    def __init__(self, url: str, *, pool_size: int = 20) -> None:
        self.engine = make_engine(url, pool_size=pool_size)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        # Connections open on first use: a process that never awaits a statement never opens one.
        self.async_pool: AsyncPool | ThreadedPool = (
            AsyncPool(url, size=min(pool_size, 16))
            if not url.startswith("sqlite")
            else ThreadedPool(self.engine)
        )

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        with self.sessions() as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()

    async def aclose(self) -> None:
        await self.async_pool.close()
