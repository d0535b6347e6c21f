"""Single statements awaited from the event loop: the hot path GET /v1/jobs/{id} (one indexed SELECT).

A plain `def` route or dependency costs a thread-pool hop and SQLAlchemy's session and execution machinery
around one statement; on a small machine that is most of the request. On PostgreSQL `AsyncPool` is a small
pool of psycopg async connections (autocommit, UTC) that runs the repository's own SQLAlchemy statements,
compiled once for psycopg. In autocommit each statement is its own transaction. SQLite (embedded mode) has
no async driver here: `ThreadedPool` runs the same statements through the SQLAlchemy engine in the thread
pool. Both have one method, `fetch_one(statement, params)` (`StatementPool`), so the repository has one
function per operation whatever the database.

Idle connections are checked before reuse (connection_looks_alive: no round trip), so the first requests
after a PostgreSQL restart do not fail on connections the old server closed.

The pool belongs to the event loop that first used it; a request on another loop (tests that start several
loops) gets a fresh pool, and the old connections are closed without awaiting the dead loop.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import anyio.to_thread
import psycopg
import sqlalchemy as sa
from psycopg.rows import dict_row
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine, make_url

_PSYCOPG = postgresql.psycopg.dialect()
T = TypeVar("T")


def psycopg_conninfo(database_url: str) -> str:
    """A libpq URI from a SQLAlchemy URL (postgresql+psycopg://... → postgresql://...)."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


class AsyncPool:
    def __init__(self, database_url: str, *, size: int = 8, connect_timeout_s: float = 5.0) -> None:
        self.conninfo = psycopg_conninfo(database_url)
        self.size = size
        self.connect_timeout_s = connect_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[psycopg.AsyncConnection[dict[str, Any]]] = []
        self._slots: asyncio.Semaphore | None = None
        self._compiled: dict[int, tuple[sa.Executable, str]] = {}

    def sql(self, statement: sa.Executable) -> str:
        """The statement's SQL for psycopg, compiled once."""
        found = self._compiled.get(id(statement))
        if found is None:
            found = (statement, str(statement.compile(dialect=_PSYCOPG)))  # type: ignore[attr-defined]
            self._compiled[id(statement)] = found  # the statement is kept, so its id stays unique
        return found[1]

    def _bind_loop(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._slots is None:
            self._discard_all()
            self._loop = loop
            self._slots = asyncio.Semaphore(self.size)
        return self._slots

    async def _connect(self) -> psycopg.AsyncConnection[dict[str, Any]]:
        return await psycopg.AsyncConnection.connect(
            self.conninfo,
            autocommit=True,
            row_factory=dict_row,
            connect_timeout=max(1, int(self.connect_timeout_s)),
            options="-c TimeZone=UTC",
        )

    async def _checkout(self) -> tuple[psycopg.AsyncConnection[dict[str, Any]], bool]:
        """An idle connection that still looks alive (and True), or a new one (and False)."""
        while self._idle:
            conn = self._idle.pop()
            if connection_looks_alive(conn):
                return conn, True
            await _close_quietly(conn)
        return await self._connect(), False

    async def fetch_one(
        self, statement: sa.Executable, params: Mapping[str, Any], *, idempotent: bool = False
    ) -> dict[str, Any] | None:
        """One statement's first row. `idempotent` statements (reads) that fail on a reused connection are
        tried once more on a fresh one: a connection the server dropped without a word (no FIN yet) is
        only found by using it."""
        sql = self.sql(statement)
        slots = self._bind_loop()
        async with slots:
            conn, reused = await self._checkout()
            try:
                return await self._run(conn, sql, params)
            except psycopg.OperationalError:
                if not (idempotent and reused):
                    raise
            return await self._run(await self._connect(), sql, params)

    async def _run(
        self, conn: psycopg.AsyncConnection[dict[str, Any]], sql: str, params: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        try:
            cursor = await conn.execute(sql, params)
            row = await cursor.fetchone()
        except BaseException:
            await _close_quietly(conn)  # a broken or cancelled connection is not reused
            raise
        if conn.closed or conn.broken:
            await _close_quietly(conn)
        else:
            self._idle.append(conn)
        return row

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await _close_quietly(conn)

    def _discard_all(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.pgconn.finish()  # the socket only: the loop these connections belonged to is gone


class ThreadedPool:
    """StatementPool on a SQLAlchemy engine, for a database without an async driver here (SQLite): each
    statement runs on an autocommit connection of the engine's pool, in the thread pool."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    async def fetch_one(
        self, statement: sa.Executable, params: Mapping[str, Any], *, idempotent: bool = False
    ) -> dict[str, Any] | None:
        return await anyio.to_thread.run_sync(self._fetch_one, statement, params)

    def _fetch_one(self, statement: sa.Executable, params: Mapping[str, Any]) -> dict[str, Any] | None:
        with self.autocommit.connect() as conn:
            row = conn.execute(statement, dict(params)).mappings().first()
        return dict(row) if row is not None else None

    async def transaction(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(connection, *args) in one transaction (committed when it returns), in the thread pool."""
        return await anyio.to_thread.run_sync(self._transaction, fn, *args)

    def _transaction(self, fn: Callable[..., T], *args: Any) -> T:
        with self.engine.begin() as conn:
            return fn(conn, *args)

    async def close(self) -> None:
        return None


def connection_looks_alive(conn: Any) -> bool:
    """Whether an idle connection is still usable, without a round trip. An idle autocommit connection has
    nothing to read: when its socket is readable, the server has closed it or is about to (a restart sends
    "terminating connection" and closes), so it is discarded instead of failing the next request."""
    if conn.closed or conn.broken:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable


async def _close_quietly(conn: psycopg.AsyncConnection[Any]) -> None:
    try:
        await conn.close()
    except Exception:
        conn.pgconn.finish()


# What the repository's awaited functions take: Database.async_pool.
StatementPool = AsyncPool | ThreadedPool
