"""Single statements on PostgreSQL straight from the event loop: the hot paths GET /v1/jobs/{id} (one
indexed SELECT) and POST /v1/jobs (one INSERT of the job and its first event).

A plain `def` route or dependency costs a thread-pool hop and SQLAlchemy's session and execution machinery
around one statement; on a small machine that is most of the request. This is a small pool of psycopg async
connections (autocommit, UTC), used only for statements whose SQL the repository compiled from its own
SQLAlchemy statements. In autocommit each statement is its own transaction: when `fetch_one` returns, a
write is committed, and durably so (the connection leaves `synchronous_commit` at the server's setting, on
by default: the COMMIT waits for the WAL flush). SQLite (embedded mode) has no async driver here and keeps
the thread-pool path.

The pool belongs to the event loop that first used it; a request on another loop (tests that start several
loops) gets a fresh pool, and the old connections are closed without awaiting the dead loop.
"""

from __future__ import annotations

import asyncio
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

    async def fetch_one(self, sql: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
        slots = self._bind_loop()
        async with slots:
            conn = self._idle.pop() if self._idle else await self._connect()
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


async def _close_quietly(conn: psycopg.AsyncConnection[Any]) -> None:
    try:
        await conn.close()
    except Exception:
        conn.pgconn.finish()
