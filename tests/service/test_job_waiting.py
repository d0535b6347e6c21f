"""A job that no live worker can take says so (issue 45), on the real app and PostgreSQL: the job view
(GET /v1/jobs/{id}, the list, the live stream's `job` frames), the job pages, the client's models and the
`stare` CLI's status text, and the embedded launcher's progress line all show "waiting: no live worker serves
queue X" instead of a bare `queued`, from the worker registry; a live worker of the queue clears it, a stale
one does not, a running job never shows it; the exporter's count (stare_jobs_without_worker) agrees.

Each test routes its jobs to a queue of its own (a declared worker class), so the workers other tests
register in the session database do not serve it."""

from __future__ import annotations

import html
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient

from stare_client import models as client_models
from stare_client.cli.jobs import job_status_text
from store import repository
from store.database import Database
from tests.service.conftest import TenantKey
from tests.service.helpers import FakeWorker, create_job
from tests.service.test_history import sse_events
from worker.embedded import progress_line
from worker.metrics import FleetCollector

SIGN_IN = {"X-Stare-Sign-In": "1"}


def _queue_client(make_client: Callable[..., TestClient], **overrides: Any) -> tuple[TestClient, str]:
    queue = f"wait-{uuid.uuid4().hex[:10]}"
    overrides.setdefault("worker_registry_cache_s", 0.0)  # each request reads the registry
    return make_client(worker_classes=[{"queue": queue}], **overrides), queue


def _register(db: Database, queue: str, *, beat_ago_s: float = 0.0) -> str:
    worker_id = f"test-worker-{uuid.uuid4().hex[:8]}"
    with db.transaction() as session:
        now = repository.db_now(session) - timedelta(seconds=beat_ago_s)
        repository.register_worker(session, worker_id, {"queue": queue}, [queue], now=now)
    return worker_id


def _unregister(db: Database, worker_id: str) -> None:
    with db.transaction() as session:
        repository.remove_worker(session, worker_id)


def _get(client: TestClient, tenant: TenantKey, job_id: str) -> dict[str, Any]:
    response = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_a_queued_job_without_a_live_worker_says_why_in_the_api_the_client_and_the_progress_line(
    make_client: Callable[..., TestClient], tenant: TenantKey, db: Database
) -> None:
    client, queue = _queue_client(make_client)
    job_id = create_job(client, tenant.headers)
    message = f"no live worker serves queue '{queue}'"
    job = _get(client, tenant, job_id)
    assert job["status"] == "queued" and job["queue"] == queue
    assert job["waiting"] == {"code": "no_live_worker", "queue": queue, "message": message}
    listed = client.get("/v1/jobs", headers=tenant.headers).json()["data"]
    assert next(j for j in listed if j["id"] == job_id)["waiting"]["message"] == message
    # What each client shows: the launcher's progress line, the client's model, the CLI's status text.
    assert progress_line(job).startswith(f"[queued]  waiting: {message}  step 0/20")
    parsed = client_models.Job.model_validate(job)
    assert parsed.waiting is not None and parsed.waiting.message == message
    assert f"waiting: {message}" in job_status_text(parsed)
    # A live worker of the queue: nothing to say; the bare status again.
    worker = _register(db, queue)
    try:
        job = _get(client, tenant, job_id)
        assert job["waiting"] is None and progress_line(job).startswith("[queued]  step 0/20")
        assert job_status_text(client_models.Job.model_validate(job)) == "queued"
    finally:
        _unregister(db, worker)
    assert _get(client, tenant, job_id)["waiting"]["code"] == "no_live_worker"


def test_a_stale_worker_does_not_count_and_a_running_job_never_waits(
    make_client: Callable[..., TestClient], tenant: TenantKey, db: Database
) -> None:
    client, queue = _queue_client(make_client, worker_stale_after_s=30.0)
    job_id = create_job(client, tenant.headers)
    worker = _register(db, queue, beat_ago_s=120.0)  # beat two minutes ago: no longer live
    try:
        assert _get(client, tenant, job_id)["waiting"]["queue"] == queue
    finally:
        _unregister(db, worker)
    FakeWorker(db, job_id)  # claimed: running, whatever the registry says
    job = _get(client, tenant, job_id)
    assert job["status"] == "running" and job["waiting"] is None


def test_the_job_pages_and_the_live_stream_show_the_waiting_reason(
    make_client: Callable[..., TestClient], tenant: TenantKey
) -> None:
    client, queue = _queue_client(make_client, sse_max_duration_s=1.0)
    job_id = create_job(client, tenant.headers)
    shown = html.escape(f" · waiting: no live worker serves queue '{queue}'")
    assert client.post("/ui/session", json={"api_key": tenant.key}, headers=SIGN_IN).status_code == 200
    page = client.get(f"/ui/jobs/{job_id}")
    assert (
        page.status_code == 200
        and f'<span id="waiting" class="waiting" role="status">{shown}</span>' in page.text
    )
    assert f'<span class="waiting">{shown}</span>' in client.get("/ui/jobs").text
    stream = client.get(f"/v1/jobs/{job_id}/live", headers=tenant.headers).text  # ends after 1 s
    frames = [e for e in sse_events(stream) if e["event"] == "job"]
    assert frames and f"no live worker serves queue '{queue}'" in frames[0]["data"]


def test_the_exporter_counts_the_jobs_no_live_worker_can_take(
    make_client: Callable[..., TestClient], tenant: TenantKey, db: Database
) -> None:
    client, queue = _queue_client(make_client)
    for _ in range(2):
        create_job(client, tenant.headers)
    with db.sessions() as session:
        assert repository.jobs_without_worker(session, 60.0).get(queue) == 2
    samples = _orphan_samples(db)
    assert samples[queue] == 2.0 and "training" in samples  # the training queue has a series, 0 or not
    worker = _register(db, queue)
    try:
        with db.sessions() as session:
            assert queue not in repository.jobs_without_worker(session, 60.0)
            assert queue in repository.live_queues(session, 60.0)
        assert queue not in _orphan_samples(db)
    finally:
        _unregister(db, worker)


def _orphan_samples(db: Database) -> dict[str, float]:
    """stare_jobs_without_worker by queue, as the exporter publishes it (the training queue always)."""
    families = {family.name: family for family in FleetCollector(db, None, ("training",)).collect()}
    family = families["stare_jobs_without_worker"]
    return {sample.labels["queue"]: sample.value for sample in family.samples}


def test_a_job_queued_behind_a_cancelling_one_says_so(
    make_client: Callable[..., TestClient], tenant: TenantKey, db: Database
) -> None:
    """Issue 46: a worker of the queue is busy with a job that is cancelling; a job queued behind it says
    why it waits (GET of the one job: the reason needs a query of its own), until that job has ended."""
    client, queue = _queue_client(make_client)
    worker_id = _register(db, queue)
    try:
        first = create_job(client, tenant.headers)
        running = FakeWorker(db, first)
        assert (
            client.post(f"/v1/jobs/{first}/cancel", headers=tenant.headers).json()["status"] == "cancelling"
        )
        second = create_job(client, tenant.headers)
        message = "queued behind a job that is cancelling: it starts once that job's trainer has stopped"
        job = _get(client, tenant, second)
        assert job["waiting"] == {"code": "behind_cancelling", "queue": queue, "message": message}
        assert f"waiting: {message}" in job_status_text(client_models.Job.model_validate(job))
        assert _get(client, tenant, first)["waiting"] is None  # the cancelling job itself does not wait
        running.finish("cancelled")
        assert _get(client, tenant, second)["waiting"] is None
    finally:
        _unregister(db, worker_id)
