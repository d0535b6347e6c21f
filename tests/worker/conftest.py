"""Fixtures of the worker reliability suite (issue 5): real Redis, real PostgreSQL, real worker processes.

The session starts PRIVATE servers, because tests 3 and 4 flush and restart the broker and restart the
database while other suites may share the machine's servers: a redis-server on a free port and a
PostgreSQL cluster made with initdb and run with pg_ctl (as the `postgres` OS user when we are root). If
either cannot start here, the suite falls back to the shared server (STARE_TEST_REDIS_URL, or PostgreSQL on
STARE_TEST_PG_HOST/PORT) and the tests that restart that server are skipped, saying why.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from store import migrate
from store.database import Database
from tests.worker.harness import FIGURES, Harness, Infra
from tests.worker.servers import PrivatePostgres, PrivateRedis

SHARED_REDIS_URL = os.environ.get("STARE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
SHARED_PG_HOST = os.environ.get("STARE_TEST_PG_HOST", "127.0.0.1")
SHARED_PG_PORT = int(os.environ.get("STARE_TEST_PG_PORT", "5432"))


def _create_database(host: str, port: int, users: tuple[str | None, ...]) -> tuple[str, str, str]:
    """CREATE DATABASE on a server; returns (name, user, url)."""
    errors = []
    for user in users:
        try:
            with psycopg.connect(
                host=host, port=port, dbname="postgres", user=user, autocommit=True, connect_timeout=10
            ) as conn:
                name = f"stare_worker_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                actual = conn.info.user
                return name, actual, f"postgresql+psycopg://{actual}@{host}:{port}/{name}"
        except psycopg.OperationalError as err:
            errors.append(f"{user or 'OS user'}: {err}")
    raise RuntimeError(f"cannot create a database on {host}:{port}: {'; '.join(errors)}")


def _drop_database(host: str, port: int, user: str, name: str) -> None:
    with psycopg.connect(host=host, port=port, dbname="postgres", user=user, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def infra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Infra]:
    workdir = tmp_path_factory.mktemp("worker-infra")
    notes: list[str] = []

    private_redis: PrivateRedis | None = None
    if PrivateRedis.available():
        private_redis = PrivateRedis(workdir)
        private_redis.start()
        broker_url = private_redis.url(0)
    else:
        notes.append("redis-server not found: using the shared Redis; the Redis restart test is skipped")
        broker_url = SHARED_REDIS_URL

    private_pg: PrivatePostgres | None = None
    try:
        private_pg = PrivatePostgres()
        private_pg.start()
        pg_host, pg_port = "127.0.0.1", private_pg.port
    except Exception as err:  # no initdb, no runuser, no postgres user...
        notes.append(f"no private PostgreSQL ({err}); using the shared server; its restart test is skipped")
        if private_pg is not None:
            private_pg.destroy()
        private_pg = None
        pg_host, pg_port = SHARED_PG_HOST, SHARED_PG_PORT
    users: tuple[str | None, ...] = ("postgres",) if private_pg is not None else (None, "postgres")
    name, user, url = _create_database(pg_host, pg_port, users)
    migrate.upgrade(url)

    artifact_root = workdir / "artifacts"
    artifact_root.mkdir()
    db = Database(url, pool_size=4)
    infra = Infra(
        database_url=url,
        broker_url=broker_url,
        artifact_root=artifact_root,
        db=db,
        redis=private_redis,
        postgres=private_pg,
        notes=notes,
    )
    try:
        yield infra
    finally:
        db.dispose()
        if private_pg is not None:
            private_pg.destroy()
        else:
            _drop_database(pg_host, pg_port, user, name)
        if private_redis is not None:
            private_redis.stop()


@pytest.fixture
def make_harness(
    infra: Infra, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., Harness]]:
    built: list[Harness] = []

    def build(**kwargs: Any) -> Harness:
        harness = Harness(infra, request.node.name, tmp_path, **kwargs)
        built.append(harness)
        return harness

    yield build
    for harness in built:
        harness.close()


@pytest.fixture
def harness(make_harness: Callable[..., Harness]) -> Harness:
    return make_harness()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("worker reliability figures")
    for test, values in FIGURES.items():
        terminalreporter.write_line(f"{test}: {json.dumps(values, sort_keys=True, default=str)}")
    target = os.environ.get("STARE_RELIABILITY_JSON")
    if target:
        Path(target).write_text(json.dumps(FIGURES, indent=2, sort_keys=True, default=str))
