"""Fixtures of the live monitoring tests: one stack (API, worker, exporter, Prometheus) for the session, on
the session's PostgreSQL (a database of its own) and Redis (its own queue): tests/services.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from store import migrate
from store.database import Database
from tests.monitoring.stack import Stack, running_stack
from tests.services import PostgresServer
from tests.worker.harness import Infra, harness_for


@pytest.fixture(scope="session")
def monitoring_infra(
    test_postgres: PostgresServer, test_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Infra]:
    name = test_postgres.create("stare_monitoring_test")
    url = test_postgres.url(name)
    migrate.upgrade(url)
    root = tmp_path_factory.mktemp("monitoring-artifacts")
    db = Database(url, pool_size=4)
    try:
        yield Infra(
            database_url=url, broker_url=test_redis_url, artifact_root=root, db=db, redis=None, postgres=None
        )
    finally:
        db.dispose()
        test_postgres.drop(name)


@pytest.fixture(scope="session")
def stack(monitoring_infra: Infra, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("monitoring-stack")
    with (
        harness_for(monitoring_infra, "monitoring", folder) as harness,
        running_stack(harness, folder) as live,
    ):
        yield live
