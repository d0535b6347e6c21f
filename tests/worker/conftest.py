"""Fixtures of the worker reliability suite (issue 5): real Redis, real PostgreSQL, real worker processes.

The session starts PRIVATE servers, because tests 3 and 4 flush and restart the broker and restart the
database while other suites may share the session's servers: a redis-server on a free port and a
PostgreSQL cluster made with initdb and run with pg_ctl (as the `postgres` OS user when we are root;
tests/servers.py). If either cannot start here, the suite falls back to the session's server
(tests/services.py) and the tests that restart that server are skipped, saying why.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from store import migrate
from store.database import Database
from tests import services
from tests.servers import PrivatePostgres, PrivateRedis
from tests.services import PostgresServer
from tests.worker.harness import FIGURES, Harness, Infra


def _create_database(server: PostgresServer) -> tuple[str, str]:
    """CREATE DATABASE on a server; returns (name, url)."""
    name = server.create("stare_worker_test")
    return name, server.url(name)


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
        notes.append("redis-server not found: using the session's Redis; the Redis restart test is skipped")
        broker_url = services.redis_url()

    private_pg: PrivatePostgres | None = None
    try:
        private_pg = PrivatePostgres()
        private_pg.start()
        server = PostgresServer("127.0.0.1", private_pg.port, "postgres")
    except Exception as err:  # no initdb, no runuser, no postgres user...
        notes.append(
            f"no private PostgreSQL ({err}); using the session's server; its restart test is skipped"
        )
        if private_pg is not None:
            private_pg.destroy()
        private_pg = None
        server = services.postgres()
    name, url = _create_database(server)
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
            server.drop(name)
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
