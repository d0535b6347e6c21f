"""POST /v1/jobs on PostgreSQL runs on the event loop (store.async_pool): one query, one transaction, inserts
the job and its first event. It is the only create path (SQLite, the embedded mode, awaits the same
functions on the engine in a thread). These pin down what it must keep: durability before the doorbell,
the response is the stored job, Idempotency-Key under concurrency and across tenants, the error shapes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from service import job_specs
from store import repository
from store.async_pool import AsyncPool, psycopg_conninfo
from store.errors import Invalid
from tests.service.conftest import TenantKey
from tests.service.helpers import GOOD_JSONL, TINY_SPEC, new_job, upload
from tests.service.test_errors import assert_error


class CommittedCheckingQueue:
    """A job queue that, when the doorbell rings, looks at the database from another connection: what a
    worker picking the message up at once would see."""

    def __init__(self, database_url: str) -> None:
        self.conninfo = psycopg_conninfo(database_url)
        self.seen: dict[str, tuple[str | None, list[str]]] = {}

    def enqueue(self, job_id: str, queue: str) -> bool:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            row = conn.execute("SELECT status FROM jobs WHERE id = %s", (job_id,)).fetchone()
            events = conn.execute("SELECT type FROM job_events WHERE job_id = %s ORDER BY seq", (job_id,))
            self.seen[job_id] = (row[0] if row else None, [e[0] for e in events])
        return True

    async def enqueue_async(self, job_id: str, queue: str) -> bool:
        return self.enqueue(job_id, queue)  # blocks the loop: what the route awaits must have happened

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def services_of(client: TestClient) -> Any:
    return client.app.state.services  # type: ignore[attr-defined]


def test_the_create_path_on_postgresql_is_the_async_one(client: TestClient) -> None:
    assert services_of(client).db.async_pool is not None


def test_the_job_and_its_first_event_are_committed_before_the_doorbell_rings(
    make_client: Callable[..., TestClient], tenant: TenantKey, pg_url: str
) -> None:
    client = make_client()
    queue = CommittedCheckingQueue(pg_url)
    services_of(client).queue = queue
    response = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers=tenant.headers)
    assert response.status_code == 201, response.text
    assert queue.seen == {response.json()["id"]: ("queued", ["job.created"])}


def test_the_response_is_the_stored_job(client: TestClient, tenant: TenantKey, pg_url: str) -> None:
    body = {"spec": TINY_SPEC, "metadata": {"team": "rl", "run": "7"}}
    created = client.post("/v1/jobs", json=body, headers=tenant.headers)
    assert created.status_code == 201 and "Idempotent-Replayed" not in created.headers
    job = created.json()
    got = client.get(f"/v1/jobs/{job['id']}", headers=tenant.headers).json()
    # disk_bytes is measured on GET of one job only: 0 before a worker wrote anything
    assert job["disk_bytes"] is None and got.pop("disk_bytes") == 0
    assert got == {k: v for k, v in job.items() if k != "disk_bytes"}
    with psycopg.connect(psycopg_conninfo(pg_url)) as conn:
        row = conn.execute(
            "SELECT tenant_id, spec, spec_hash, run_dir, event_seq, attempt, max_attempts, enqueued_at,"
            " idempotency_key, request_hash FROM jobs WHERE id = %s",
            (job["id"],),
        ).fetchone()
        event = conn.execute(
            "SELECT seq, type, level, message, data FROM job_events WHERE job_id = %s", (job["id"],)
        ).fetchall()
    assert row is not None
    tenant_id, spec, spec_hash, run_dir, event_seq, attempt, max_attempts, enqueued_at, key, request_hash = (
        row
    )
    assert tenant_id == tenant.tenant_id and spec == TINY_SPEC  # as submitted; the response shows it resolved
    assert spec_hash == job_specs.canonical_hash(job["spec"])
    assert run_dir == f"{tenant.tenant_id}/{job['id']}/run"
    assert (event_seq, attempt, max_attempts) == (1, 0, 3)
    assert enqueued_at is not None and key is None and request_hash is None
    assert event == [
        (1, "job.created", "info", "Job created and queued", {"queue": "training", "total_steps": 20})
    ]


def test_quotes_and_sql_in_what_a_tenant_sends_are_stored_as_sent(
    client: TestClient, tenant: TenantKey, pg_url: str
) -> None:
    """The create query binds its parameters on the client side (store.async_pool.fetch_in_transaction):
    psycopg quotes every value, so text that looks like SQL is data, in the row and in the response."""
    hostile = "x'); DELETE FROM jobs; -- \\ $$ %s %(name)s ; \" ' "
    body = {"spec": {**TINY_SPEC, "name": hostile}, "metadata": {hostile[:64]: hostile, "b": "'"}}
    headers = {**tenant.headers, "Idempotency-Key": hostile}
    created = client.post("/v1/jobs", json=body, headers=headers)
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["name"] == hostile and job["metadata"] == body["metadata"]
    got = client.get(f"/v1/jobs/{job['id']}", headers=tenant.headers).json()
    assert got.pop("disk_bytes") == 0 and got == {k: v for k, v in job.items() if k != "disk_bytes"}
    with psycopg.connect(psycopg_conninfo(pg_url)) as conn:
        row = conn.execute(
            "SELECT name, metadata, idempotency_key FROM jobs WHERE id = %s", (job["id"],)
        ).fetchone()
        jobs = conn.execute("SELECT count(*) FROM jobs WHERE tenant_id = %s", (tenant.tenant_id,)).fetchone()
    assert row == (hostile, body["metadata"], hostile)
    assert jobs == (1,)
    replay = client.post("/v1/jobs", json=body, headers=headers)
    assert replay.headers["Idempotent-Replayed"] == "true" and replay.json()["id"] == job["id"]


def test_an_idempotency_key_belongs_to_its_tenant(
    client: TestClient, make_tenant: Callable[[], TenantKey]
) -> None:
    first, second = make_tenant(), make_tenant()
    key = {"Idempotency-Key": f"k-{uuid.uuid4().hex}"}
    a = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers={**first.headers, **key})
    b = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers={**second.headers, **key})
    assert a.status_code == b.status_code == 201
    assert a.json()["id"] != b.json()["id"]
    assert "Idempotent-Replayed" not in b.headers
    replay = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers={**second.headers, **key})
    assert replay.json() == b.json() and replay.headers["Idempotent-Replayed"] == "true"


def test_a_replay_shows_the_job_as_it_is_now(client: TestClient, tenant: TenantKey) -> None:
    headers = {**tenant.headers, "Idempotency-Key": "replay-after-cancel"}
    job_id = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers=headers).json()["id"]
    client.post(f"/v1/jobs/{job_id}/cancel", headers=tenant.headers)
    replay = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers=headers)
    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == job_id and replay.json()["status"] == "cancelled"


def _new_job(tenant_id: str, key: str, request_hash: str) -> repository.NewJob:
    return new_job(
        tenant_id,
        name="race",
        spec=TINY_SPEC,
        resolved_spec={"name": "race"},
        total_steps=20,
        idempotency_key=key,
        request_hash=request_hash,
    )


def test_concurrent_requests_with_one_idempotency_key_create_one_job(tenant: TenantKey, pg_url: str) -> None:
    key = f"race-{uuid.uuid4().hex}"

    async def race() -> list[Any]:
        pool = AsyncPool(pg_url, size=8)
        try:
            same = [repository.create_job(pool, _new_job(tenant.tenant_id, key, "h1")) for _ in range(8)]
            return await asyncio.gather(*same)
        finally:
            await pool.close()

    results = asyncio.run(race())
    assert sum(created for _, created in results) == 1
    assert len({job.id for job, _ in results}) == 1
    with psycopg.connect(psycopg_conninfo(pg_url)) as conn:
        jobs = conn.execute(
            "SELECT id FROM jobs WHERE tenant_id = %s AND idempotency_key = %s", (tenant.tenant_id, key)
        ).fetchall()
        events = conn.execute("SELECT count(*) FROM job_events WHERE job_id = %s", (jobs[0][0],)).fetchone()
    assert len(jobs) == 1 and events == (1,)

    async def reuse() -> None:
        pool = AsyncPool(pg_url, size=1)
        try:
            await repository.create_job(pool, _new_job(tenant.tenant_id, key, "h2"))
        finally:
            await pool.close()

    with pytest.raises(Invalid) as err:
        asyncio.run(reuse())
    assert err.value.code == "idempotency_key_reused"


def test_a_file_with_another_purpose_is_a_422(client: TestClient, tenant: TenantKey) -> None:
    file_id = upload(client, tenant.headers, GOOD_JSONL, purpose="rl_eval").json()["id"]
    body = {"spec": {**TINY_SPEC, "task": {"params": {}}}, "training_file": file_id}
    assert_error(client.post("/v1/jobs", json=body, headers=tenant.headers), 422, param="training_file")


def test_the_active_job_limit_counts_on_the_async_path(
    make_client: Callable[..., TestClient], tenant: TenantKey
) -> None:
    client = make_client(max_active_jobs_per_tenant=2)
    ids = [
        client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers=tenant.headers).json()["id"]
        for _ in range(2)
    ]
    refused = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers=tenant.headers)
    assert_error(refused, 429, "active_job_limit")
    assert refused.headers["Retry-After"] == "60"
    client.post(f"/v1/jobs/{ids[0]}/cancel", headers=tenant.headers)  # a finished job frees a slot
    assert client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers=tenant.headers).status_code == 201


def _job_count(pg_url: str, tenant_id: str) -> int:
    with psycopg.connect(psycopg_conninfo(pg_url)) as conn:
        row = conn.execute("SELECT count(*) FROM jobs WHERE tenant_id = %s", (tenant_id,)).fetchone()
    return int(row[0]) if row else 0


def test_a_database_outage_on_create_is_a_503_and_stores_nothing(
    make_client: Callable[..., TestClient], tenant: TenantKey, pg_url: str
) -> None:
    client = make_client()
    assert client.get("/v1/me", headers=tenant.headers).status_code == 200  # the key is cached now
    pool = services_of(client).db.async_pool
    pool._discard_all()
    pool.conninfo = "postgresql://nobody@127.0.0.1:1/none"  # the database host goes away
    response = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers=tenant.headers)
    assert_error(response, 503, "database_unavailable")
    assert response.headers["Retry-After"] == "5"
    assert _job_count(pg_url, tenant.tenant_id) == 0


def test_a_constraint_violation_on_create_is_a_409_in_the_error_shape(
    make_client: Callable[..., TestClient], tenant: TenantKey, pg_url: str
) -> None:
    client = make_client()
    assert client.get("/v1/me", headers=tenant.headers).status_code == 200  # the key is cached now
    with psycopg.connect(psycopg_conninfo(pg_url)) as conn:  # the tenant is deleted meanwhile
        conn.execute("DELETE FROM tenants WHERE id = %s", (tenant.tenant_id,))
    response = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers=tenant.headers)
    assert_error(response, 409, "conflict")
    assert _job_count(pg_url, tenant.tenant_id) == 0


def test_on_sqlite_the_same_create_path_keeps_idempotency(tmp_path: Any) -> None:
    from store import migrate
    from store.database import Database

    url = f"sqlite:///{tmp_path / 'stare.db'}"
    migrate.upgrade(url)
    db = Database(url, pool_size=1)
    try:
        with db.transaction() as session:
            tenant_id = repository.create_tenant(session, "sqlite").id
        first, created = asyncio.run(repository.create_job(db.async_pool, _new_job(tenant_id, "k", "h1")))
        again, replayed = asyncio.run(repository.create_job(db.async_pool, _new_job(tenant_id, "k", "h1")))
        assert created and not replayed and again.id == first.id
        with db.sessions() as session:
            events = repository.list_events(session, first.id, after=0, limit=10)[0]
        assert [e.type for e in events] == ["job.created"]
        with pytest.raises(Invalid):
            asyncio.run(repository.create_job(db.async_pool, _new_job(tenant_id, "k", "h2")))
        read = asyncio.run(repository.read_job(db.async_pool, tenant_id, first.id))
        assert read is not None and read.status == "queued" and read.created_at == first.created_at
    finally:
        db.dispose()
