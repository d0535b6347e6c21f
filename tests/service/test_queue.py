"""The doorbell: after the job row is committed, a Celery message naming only the job id reaches the Redis
broker on the job's queue (real Redis; the service never imports the worker). A broker outage costs no job."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import kombu
import pytest
import redis
from fastapi.testclient import TestClient

from service.queue import CeleryJobQueue
from store import repository
from store.database import Database
from store.models import Job
from tests.service.conftest import TenantKey
from tests.service.helpers import TINY_SPEC
from tests.services import redis_url


@pytest.fixture
def queue_name() -> Iterator[str]:
    name = f"test-training-{uuid.uuid4().hex[:10]}"
    yield name
    broker = redis.Redis.from_url(redis_url())
    broker.delete(name)
    for key in broker.scan_iter("_kombu.binding.*"):
        for member in broker.smembers(key):
            if name.encode() in member:
                broker.srem(key, member)


def pop_message(queue: str) -> dict[str, Any]:
    raw = redis.Redis.from_url(redis_url()).rpop(queue)
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


# Per-message values: ids, and the sender's per-thread reply address and origin.
PER_MESSAGE_HEADERS = {"id", "root_id"}
PER_MESSAGE_PROPERTIES = {"correlation_id", "delivery_tag", "reply_to"}


def test_the_message_pushed_from_the_event_loop_is_the_one_send_task_sends(queue_name: str) -> None:
    """enqueue_async builds the message without a broker connection (Celery's task message, kombu's envelope
    from its own Producer.publish); it must stay equal to what send_task sends."""
    queue = CeleryJobQueue(redis_url(), "worker.train_job")
    assert queue.pushes_from_the_loop
    assert queue.enqueue("job_A", queue_name)
    celery_sent = pop_message(queue_name)

    async def push() -> bool:
        try:
            return await queue.enqueue_async("job_A", queue_name)
        finally:
            await queue.aclose()

    assert asyncio.run(push())
    ours = pop_message(queue_name)
    queue.close()
    assert ours.keys() == celery_sent.keys()
    assert ours["body"] == celery_sent["body"]  # base64 of [["job_A"], {}, {embed}]
    assert {k: v for k, v in ours.items() if k not in ("headers", "properties")} == {
        k: v for k, v in celery_sent.items() if k not in ("headers", "properties")
    }

    def without(d: dict[str, Any], keys: set[str]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k not in keys}

    assert without(ours["headers"], PER_MESSAGE_HEADERS) == without(
        celery_sent["headers"], PER_MESSAGE_HEADERS
    )
    assert without(ours["properties"], PER_MESSAGE_PROPERTIES) == without(
        celery_sent["properties"], PER_MESSAGE_PROPERTIES
    )
    assert ours["headers"]["id"] == ours["headers"]["root_id"] == ours["properties"]["correlation_id"]
    assert ours["headers"]["id"] != celery_sent["headers"]["id"]
    assert ours["properties"]["delivery_tag"] != celery_sent["properties"]["delivery_tag"]


def test_kombu_consumes_the_message_pushed_from_the_event_loop(queue_name: str) -> None:
    queue = CeleryJobQueue(redis_url(), "worker.train_job")

    async def push() -> bool:
        try:
            return await queue.enqueue_async("job_B", queue_name)
        finally:
            await queue.aclose()

    assert asyncio.run(push())
    with kombu.Connection(redis_url()) as connection:
        message = connection.SimpleQueue(queue_name).get(timeout=5)
        assert message.headers["task"] == "worker.train_job"
        args, kwargs, embed = message.decode()
        assert args == ["job_B"] and kwargs == {} and embed["chain"] is None
        assert message.delivery_info["routing_key"] == queue_name
        message.ack()
    queue.close()


def test_a_broker_outage_on_the_event_loop_path_is_counted_not_raised() -> None:
    queue = CeleryJobQueue("redis://127.0.0.1:1/0", "worker.train_job", timeout_s=0.5)

    async def push() -> bool:
        try:
            return await queue.enqueue_async("job_C", "nowhere")
        finally:
            await queue.aclose()

    assert asyncio.run(push()) is False
