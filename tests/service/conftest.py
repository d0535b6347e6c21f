"""Fixtures for the service tests: a throwaway PostgreSQL database for the session (created on the test
session's server, tests/services.py; migrated with Alembic, dropped at the end), the app built on it, and
tenants with real API keys.

Nothing is mocked: the database is PostgreSQL (SQLite in the embedded-mode tests), the broker is Redis where a
test is about the queue (elsewhere enqueueing is a recorded no-op, a settings flag), the artifact root is a
temp directory. Each test makes its own tenants, so tests share the database without seeing each other.
"""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.sessions import COOKIE_NAME, CSRF_HEADER
from service.settings import Settings
from store import migrate, repository
from store.database import Database
from tests.services import PostgresServer as Postgres
from tests.services import redis_url


@pytest.fixture(scope="session")
def postgres(test_postgres: Postgres) -> Postgres:
    """The session's PostgreSQL server (tests/services.py): throwaway databases are made on it."""
    return test_postgres


@contextlib.contextmanager
def migrated_database(postgres: Postgres, *prefix: str) -> Iterator[str]:
    """The URL of a fresh database at the latest migration, dropped on exit."""
    name = postgres.create(*prefix)
    url = postgres.url(name)
    try:
        migrate.upgrade(url)
        yield url
    finally:
        postgres.drop(name)


@pytest.fixture(scope="session")
def pg_url(postgres: Postgres) -> Iterator[str]:
    """A fresh database for this test session, at the latest migration."""
    with migrated_database(postgres) as url:
        yield url


@pytest.fixture(scope="session")
def artifact_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("artifacts")


def settings_for(database_url: str, artifact_root: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "environment": "development",
        "database_url": database_url,
        "database_pool_size": 4,
        "artifact_root": artifact_root,
        "queue_backend": "record",
        "rate_limit_per_second": 0.0,
        "tenant_rate_limit_per_second": 0.0,
        "address_rate_limit_per_second": 0.0,
        "max_active_jobs_per_tenant": 0,
        "sse_poll_interval_s": 0.05,
        "task_check_prewarm": False,  # children start on first use: most tests never generate a task
    }
    values.update(overrides)
    # The session's Redis, for the tests that reach a broker (celery queue, redis rate limiter) and give none.
    reaches_redis = values["queue_backend"] == "celery" or values.get("rate_limit_backend") == "redis"
    if reaches_redis and "broker_url" not in values:
        values["broker_url"] = redis_url()
    return Settings(**values)


@pytest.fixture(scope="session")
def settings(pg_url: str, artifact_root: Path) -> Settings:
    return settings_for(pg_url, artifact_root)


@pytest.fixture(scope="session")
def client(settings: Settings) -> Iterator[TestClient]:
    """The app on the session database (recorded enqueueing, no rate limit)."""
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture
def make_client(pg_url: str, tmp_path: Path) -> Iterator[Callable[..., TestClient]]:
    """Build an app with other settings (it gets its own artifact root)."""
    opened: list[TestClient] = []

    def build(**overrides: Any) -> TestClient:
        overrides.setdefault("artifact_root", tmp_path / "artifacts")
        artifact = overrides.pop("artifact_root")
        test_client = TestClient(
            create_app(settings_for(overrides.pop("database_url", pg_url), artifact, **overrides)),
            raise_server_exceptions=False,
        )
        test_client.__enter__()
        opened.append(test_client)
        return test_client

    yield build
    for test_client in opened:
        test_client.__exit__(None, None, None)


@pytest.fixture(scope="session")
def db(pg_url: str) -> Iterator[Database]:
    database = Database(pg_url, pool_size=2)
    yield database
    database.dispose()


@dataclass(frozen=True)
class TenantKey:
    tenant_id: str
    name: str
    key: str
    key_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


@pytest.fixture
def make_tenant(db: Database) -> Callable[[], TenantKey]:
    def build(database: Database | None = None) -> TenantKey:
        name = f"t-{uuid.uuid4().hex[:12]}"
        with (database or db).transaction() as session:
            tenant = repository.create_tenant(session, name)
            key, secret = repository.create_api_key(session, tenant.id, "test")
        return TenantKey(tenant.id, name, secret, key.id)

    return build


@pytest.fixture
def tenant(make_tenant: Callable[[], TenantKey]) -> TenantKey:
    return make_tenant()


@pytest.fixture(scope="module")
def fuzz_world(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """For the fuzzers (test_schemathesis, test_fuzz_hostile): an app, a tenant with a real key and a signed-in
    page session for it, and real objects (jobs in several states, a file, a checkpoint) whose ids replace
    generated path ids."""
    from tests.service.helpers import GOOD_JSONL, FakeWorker, create_job, upload

    root = tmp_path_factory.mktemp("fuzz-artifacts")
    app = create_app(settings_for(pg_url, root, sse_max_duration_s=1.0))
    db = Database(pg_url, pool_size=2)
    with db.transaction() as session:
        tenant_row = repository.create_tenant(session, f"fuzz-{random.randrange(10**9)}")
        key_row, secret = repository.create_api_key(session, tenant_row.id, "fuzz")
    tenant = TenantKey(tenant_row.id, tenant_row.name, secret, key_row.id)
    with TestClient(app) as client:
        file_id = upload(client, tenant.headers, GOOD_JSONL).json()["id"]
        jobs = [create_job(client, tenant.headers) for _ in range(6)]
        signed_in = client.post("/ui/session", json={"api_key": secret}, headers={"X-Stare-Sign-In": "1"})
        cookie = signed_in.cookies[COOKIE_NAME]
    signer = app.state.session_signer
    page_session = signer.verify(cookie)
    assert page_session is not None
    worker = FakeWorker(db, jobs[0])
    worker.steps(1, 5)
    checkpoint_id = worker.checkpoint(Path(root), 5)
    worker.finish("succeeded")
    FakeWorker(db, jobs[1]).steps(1, 2)
    yield {
        "app": app,
        "tenant": tenant,
        # The job page's credentials for the same key: its session cookie and the CSRF token its pages embed.
        "page_headers": {"Cookie": f"{COOKIE_NAME}={cookie}", CSRF_HEADER: signer.csrf_token(page_session)},
        "ids": {
            "job_id": jobs,
            "file_id": [file_id],
            "checkpoint_id": [checkpoint_id],
            "key_id": [key_row.id],
        },
    }
    db.dispose()


# Generated Schemathesis cases per operation (filled by test_schemathesis, reported at the end).
SCHEMATHESIS_CASES: dict[str, int] = {}


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if SCHEMATHESIS_CASES:
        total = sum(SCHEMATHESIS_CASES.values())
        terminalreporter.write_line(
            f"schemathesis: {total} generated cases over {len(SCHEMATHESIS_CASES)} operations"
        )
