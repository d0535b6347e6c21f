"""The doorbell: after the job row is committed, a Celery message naming only the job id reaches the Redis
broker on the job's queue (real Redis; the service never imports the worker). A broker outage costs no job."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from service import repository
from service.database import Database
from service.models import Job
from tests.service.conftest import REDIS_URL, TenantKey
from tests.service.helpers import TINY_SPEC


@pytest.fixture
def queue_name() -> Iterator[str]:
    name = f"test-training-{uuid.uuid4().hex[:10]}"
    yield name
    broker = redis.Redis.from_url(REDIS_URL)
    broker.delete(name)
    for key in broker.scan_iter("_kombu.binding.*"):
        for member in broker.smembers(key):
            if name.encode() in member:
                broker.srem(key, member)


def pop_message(queue: str) -> dict[str, Any]:
    raw = redis.Redis.from_url(REDIS_URL).rpop(queue)
    assert raw is not None, f"no message on {queue}"
    message: dict[str, Any] = json.loads(raw)
    return message


def test_creating_a_job_sends_its_id_to_the_training_queue(
    make_client: Callable[..., TestClient], tenant: TenantKey, db: Database, queue_name: str
) -> None:
    client = make_client(queue_backend="celery", training_queue=queue_name)
    response = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers=tenant.headers)
    assert response.status_code == 201
    job_id = response.json()["id"]
    message = pop_message(queue_name)
    assert message["headers"]["task"] == "worker.train_job"
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    assert args == [job_id] and kwargs == {}
    assert message["properties"]["delivery_info"]["routing_key"] == queue_name
    with db.sessions() as session:  # the row was committed before the message was sent
        job = session.get(Job, job_id)
        assert job is not None and job.status == "queued" and job.queue == queue_name
        assert job.enqueued_at is not None and job.enqueued_at <= repository.utcnow()

    client.post(f"/v1/jobs/{job_id}/pause", headers=tenant.headers)
    client.post(f"/v1/jobs/{job_id}/resume", headers=tenant.headers)
    args, _, _ = json.loads(base64.b64decode(pop_message(queue_name)["body"]))
    assert args == [job_id]


def test_a_broker_outage_loses_no_job(
    make_client: Callable[..., TestClient], tenant: TenantKey, db: Database
) -> None:
    client = make_client(queue_backend="celery", broker_url="redis://127.0.0.1:1/0", broker_timeout_s=0.5)
    response = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers=tenant.headers)
    assert response.status_code == 201
    job_id = response.json()["id"]
    metrics = client.get("/metrics").text
    assert "stare_enqueue_failures_total 1.0" in metrics
    later = repository.utcnow() + timedelta(minutes=2)
    with db.sessions() as session:  # the sweeper re-sends it once its doorbell is a minute old
        assert session.get(Job, job_id).status == "queued"  # type: ignore[union-attr]
        assert (job_id, "training") in repository.unclaimed_jobs(session, older_than_s=60, now=later)
        assert (job_id, "training") not in repository.unclaimed_jobs(session, older_than_s=60)
