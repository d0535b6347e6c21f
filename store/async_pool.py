"""Statements awaited from the event loop: the hot paths GET /v1/jobs/{id} (one indexed SELECT) and
POST /v1/jobs (the job and its first event, in one transaction).

A plain `def` route or dependency costs a thread-pool hop and SQLAlchemy's session and execution machinery
around one statement; on a small machine that is most of the request. On PostgreSQL `AsyncPool` is a small
pool of psycopg async connections (autocommit, UTC) that runs the repository's own SQLAlchemy statements,
compiled once for psycopg (JSON parameters are passed as JSONB, or as JSON for a column that keeps its text,
store.models.JSONText: SQLAlchemy's bind processing is not in the way). In autocommit each statement is its own transaction; `fetch_in_transaction` runs several in one (one
round trip: one simple-protocol query, which PostgreSQL runs as one transaction). SQLite (embedded mode)
has no async driver here: `ThreadedPool` runs the same statements through the SQLAlchemy engine in the
thread pool. Both have the same two methods, `fetch_one(statement, params)` and
`fetch_in_transaction(steps)` (`StatementPool`), so the repository has one function per operation, with
one body, whatever the database.

Idle connections are checked before reuse (connection_looks_alive: no round trip), so the first requests
after a PostgreSQL restart do not fail on connections the old server closed.

The pool belongs to the event loop that first used it; a request on another loop (tests that start several
loops) gets a fresh pool, and the old connections are closed without awaiting the dead loop.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Mapping, Sequence
from typing import Any

import anyio.to_thread
import psycopg
import sqlalchemy as sa
from psycopg.rows import dict_row
from psycopg.types.json import Json, Jsonb
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Engine, make_url

_PSYCOPG = postgresql.psycopg.dialect()
# One statement and its parameters, as the repository hands them to a pool.
Step = tuple[sa.Executable, Mapping[str, Any]]


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
        self._compiled: dict[int, tuple[sa.Executable, str, dict[str, type[Json | Jsonb]]]] = {}

    def sql(self, statement: sa.Executable) -> str:
        """The statement's SQL for psycopg, compiled once."""
        return self._compile(statement)[1]

    def _compile(self, statement: sa.Executable) -> tuple[sa.Executable, str, dict[str, type[Json | Jsonb]]]:
        """(statement, SQL, its JSON parameters: name -> Jsonb, or Json for a `json` column), compiled once
        per statement."""
        found = self._compiled.get(id(statement))
        if found is None:
            compiled = statement.compile(dialect=_PSYCOPG)  # type: ignore[attr-defined]
            json_binds: dict[str, type[Json | Jsonb]] = {
                name: Jsonb if isinstance(bind.type.dialect_impl(_PSYCOPG), postgresql.JSONB) else Json
                for name, bind in compiled.binds.items()
                if isinstance(bind.type, sa.JSON)
            }
            found = (statement, str(compiled), json_binds)
            self._compiled[id(statement)] = found  # the statement is kept, so its id stays unique
        return found

    def _prepared(self, statement: sa.Executable, params: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """SQL and parameters for psycopg: JSON values wrapped as Jsonb or Json (psycopg adapts no dict
        itself)."""
        _, sql, json_binds = self._compile(statement)
        return sql, {
            key: json_binds[key](value) if key in json_binds and value is not None else value
            for key, value in params.items()
        }

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
        sql, values = self._prepared(statement, params)
        slots = self._bind_loop()
        async with slots:
            conn, reused = await self._checkout()
            try:
                return await self._run(conn, sql, values)
            except psycopg.OperationalError:
                if not (idempotent and reused):
                    raise
            return await self._run(await self._connect(), sql, values)

    async def fetch_in_transaction(self, steps: Sequence[Step]) -> list[dict[str, Any] | None]:
        """Each statement's first row (None for none), all in one transaction, committed when this returns.

        The statements go out as one simple-protocol query (parameters bound by psycopg on the client side),
        which PostgreSQL runs as one implicit transaction: one round trip, and no BEGIN or COMMIT to send
        (docs/BENCHMARKS.md has what the other ways cost). Not retried (a write)."""
        sqls: list[str] = []
        values: dict[str, Any] = {}
        for statement, params in steps:
            sql, prepared = self._prepared(statement, params)
            if values.keys() & prepared.keys():
                raise ValueError(
                    f"parameter names repeat across statements: {values.keys() & prepared.keys()}"
                )
            sqls.append(sql)
            values.update(prepared)
        async with self._bind_loop():
            conn, _ = await self._checkout()
            try:
                cursor = psycopg.AsyncClientCursor(conn, row_factory=dict_row)
                await cursor.execute("; ".join(sqls), values)
                rows = [await cursor.fetchone() if cursor.description else None]
                while cursor.nextset():
                    rows.append(await cursor.fetchone() if cursor.description else None)
            except BaseException:
                await _close_quietly(conn)  # a broken or cancelled connection is not reused
                raise
            self._release(conn)
            return rows

    async def _run(
        self, conn: psycopg.AsyncConnection[dict[str, Any]], sql: str, params: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        try:
            cursor = await conn.execute(sql, params)
            row = await cursor.fetchone()
        except BaseException:
            await _close_quietly(conn)  # a broken or cancelled connection is not reused
            raise
        self._release(conn)
        return row

    def _release(self, conn: psycopg.AsyncConnection[dict[str, Any]]) -> None:
        if conn.closed or conn.broken:
            conn.pgconn.finish()
        else:
            self._idle.append(conn)

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

    async def fetch_in_transaction(self, steps: Sequence[Step]) -> list[dict[str, Any] | None]:
        return await anyio.to_thread.run_sync(self._fetch_in_transaction, steps)

    def _fetch_in_transaction(self, steps: Sequence[Step]) -> list[dict[str, Any] | None]:
        rows: list[dict[str, Any] | None] = []
        with self.engine.begin() as conn:
            for statement, params in steps:
                result = conn.execute(statement, dict(params))
                row = result.mappings().first() if result.returns_rows else None
                rows.append(dict(row) if row is not None else None)
        return rows

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
