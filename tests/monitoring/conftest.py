"""Fixtures of the live monitoring tests: one stack (API, worker, exporter, Prometheus) for the session, on
the machine's PostgreSQL (a database of its own) and Redis (its own queue)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from store import migrate
from store.database import Database
from tests.monitoring.stack import Stack, running_stack
from tests.worker.harness import Infra, harness_for

PG_HOST = os.environ.get("STARE_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("STARE_TEST_PG_PORT", "5432"))
REDIS_URL = os.environ.get("STARE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def monitoring_infra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Infra]:
    name = f"stare_monitoring_test_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(host=PG_HOST, port=PG_PORT, dbname="postgres", autocommit=True) as conn:
        user = conn.info.user
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = f"postgresql+psycopg://{user}@{PG_HOST}:{PG_PORT}/{name}"
    migrate.upgrade(url)
    root = tmp_path_factory.mktemp("monitoring-artifacts")
    db = Database(url, pool_size=4)
    try:
        yield Infra(
            database_url=url, broker_url=REDIS_URL, artifact_root=root, db=db, redis=None, postgres=None
        )
    finally:
        db.dispose()
        with psycopg.connect(host=PG_HOST, port=PG_PORT, dbname="postgres", autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def stack(monitoring_infra: Infra, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("monitoring-stack")
    with (
        harness_for(monitoring_infra, "monitoring", folder) as harness,
        running_stack(harness, folder) as live,
    ):
        yield live
