"""The API across a PostgreSQL restart, on a private cluster (tests/servers.py): while the server is
down every request is a 503 with Retry-After (never a 500); once it is back, no request fails, on either
read path (the event loop's psycopg pool and SQLAlchemy's pool), although every pooled connection was closed
by the old server. Where no private cluster can be started (no initdb) it is skipped as a missing real
component (a failure under STARE_REQUIRE_REAL_COMPONENTS=1)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from store import migrate, repository
from store.database import Database
from tests.conftest import skip_missing_component
from tests.servers import PrivatePostgres
from tests.service.conftest import settings_for
from tests.service.helpers import create_job


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivatePostgres]:
    try:
        server = PrivatePostgres()
        server.start()
    except Exception as err:
        skip_missing_component(f"no private PostgreSQL cluster: {err}")
    try:
        yield server
    finally:
        server.destroy()


def _world(server: PrivatePostgres, root: Path) -> tuple[TestClient, dict[str, str], str]:
    name = f"restart_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:{server.port}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = server.url(name)
    migrate.upgrade(url)
    db = Database(url, pool_size=2)
    with db.transaction() as session:
        tenant = repository.create_tenant(session, name)
        _, secret = repository.create_api_key(session, tenant.id, "k")
    db.dispose()
    client = TestClient(
        create_app(settings_for(url, root, database_pool_size=4)), raise_server_exceptions=False
    )
    client.__enter__()
    headers = {"Authorization": f"Bearer {secret}"}
    return client, headers, create_job(client, headers)


def _requests(job_id: str) -> list[str]:
    # The async path (one job), the SQLAlchemy session path (list, events, metrics), and readiness.
    return [f"/v1/jobs/{job_id}", "/v1/jobs", f"/v1/jobs/{job_id}/events", f"/v1/jobs/{job_id}/metrics"]


def test_no_request_fails_once_postgres_is_back(private_pg: PrivatePostgres, tmp_path: Path) -> None:
    client, headers, job_id = _world(private_pg, tmp_path)
    try:
        for _ in range(4):  # fill both pools with idle connections
            for url in _requests(job_id):
                assert client.get(url, headers=headers).status_code == 200
        private_pg.restart()  # fast shutdown: the server closes every connection, then starts again
        statuses = [
            client.get(url, headers=headers).status_code for _ in range(4) for url in _requests(job_id)
        ]
        assert statuses == [200] * len(statuses)
        assert create_job(client, headers)  # and a write on the event loop's pool
    finally:
        client.__exit__(None, None, None)


def test_requests_while_postgres_is_down_get_503_with_retry_after(
    private_pg: PrivatePostgres, tmp_path: Path
) -> None:
    client, headers, job_id = _world(private_pg, tmp_path)
    try:
        assert client.get(f"/v1/jobs/{job_id}", headers=headers).status_code == 200
        private_pg.stop()
        try:
            started = time.monotonic()
            for url in [*_requests(job_id), "/readyz"]:
                response = client.get(url, headers=headers)
                assert response.status_code == 503, (url, response.text)
                assert int(response.headers["Retry-After"]) > 0, url
            response = client.post("/v1/jobs", json={"spec": {}}, headers=headers)
            assert response.status_code == 503, response.text
            assert time.monotonic() - started < 60  # each answer comes at once, not after a hang
        finally:
            private_pg.start()
        assert client.get(f"/v1/jobs/{job_id}", headers=headers).status_code == 200
    finally:
        client.__exit__(None, None, None)
