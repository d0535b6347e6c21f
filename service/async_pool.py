"""Single statements on PostgreSQL straight from the event loop: the hot paths GET /v1/jobs/{id} (one
indexed SELECT) and POST /v1/jobs (one INSERT of the job and its first event).

A plain `def` route or dependency costs a thread-pool hop and SQLAlchemy's session and execution machinery
around one statement; on a small machine that is most of the request. This is a small pool of psycopg async
connections (autocommit, UTC), used only for statements whose SQL the repository compiled from its own
SQLAlchemy statements. In autocommit each statement is its own transaction: when `fetch_one` returns, a
write is committed, and durably so (the connection leaves `synchronous_commit` at the server's setting, on
by default: the COMMIT waits for the WAL flush). SQLite (embedded mode) has no async driver here and keeps
the thread-pool path.

Idle connections are checked before reuse (service.async_pool.connection_looks_alive: no round trip), so
the first requests after a PostgreSQL restart do not fail on connections the old server closed.

The pool belongs to the event loop that first used it; a request on another loop (tests that start several
loops) gets a fresh pool, and the old connections are closed without awaiting the dead loop.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.rows import dict_row
from sqlalchemy.engine import make_url


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
        self, sql: str, params: Mapping[str, Any], *, idempotent: bool = False
    ) -> dict[str, Any] | None:
        """One statement's first row. `idempotent` statements (reads) that fail on a reused connection are
        tried once more on a fresh one: a connection the server dropped without a word (no FIN yet) is
        only found by using it."""
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
