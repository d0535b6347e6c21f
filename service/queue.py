"""The doorbell: tell the workers a job id is ready, by Celery task name (the service never imports worker).

Enqueue only after the job row is committed. A failed send is logged and counted, not raised: the job is
safe in the database and the worker's sweeper re-sends queued jobs nobody claimed.

Two ways to send, one message. `enqueue` is Celery's `send_task` (blocking; the sync routes, and any broker
that is not Redis, e.g. the embedded mode's filesystem://). `enqueue_async` (POST /v1/jobs on the event loop)
with a Redis broker builds the same message without I/O and pushes it with one LPUSH from an asyncio Redis
client: no thread hop and none of the broker connection and client set-up of a blocking publish, which
together cost more CPU than the rest of creating a job. Nothing of the message is written here: Celery
builds the task message (`app.amqp.create_task_message`, protocol 2) and kombu builds the envelope, with its
own `Producer.publish` (serialisation, delivery mode, priority) on a virtual channel (body encoding,
delivery tag, delivery info) whose delivery keeps the message instead of sending it (`_EnvelopeChannel`).
The LPUSH is then what kombu's Redis transport does for a direct queue (routing key = queue name, default
exchange, priority 0: the list named after the queue, the message as kombu's JSON).
tests/service/test_queue.py holds it equal to a message sent by `send_task`, field by field, and has kombu's
consumer decode it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import kombu
from kombu.transport import virtual
from kombu.utils import json as kombu_json
from starlette.concurrency import run_in_threadpool

from store.settings import broker_transport_options

logger = logging.getLogger(__name__)


REDIS_SCHEMES = frozenset({"redis", "rediss"})


class JobQueue(Protocol):
    def enqueue(self, job_id: str, queue: str) -> bool: ...

    async def enqueue_async(self, job_id: str, queue: str) -> bool: ...

    def ping(self) -> None: ...

    def close(self) -> None: ...

    async def aclose(self) -> None: ...


class _EnvelopeChannel(virtual.Channel):
    """kombu's virtual channel, delivering to a list instead of a broker: what Producer.publish hands it is
    the message kombu's Redis transport would push, envelope and all."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delivered: list[tuple[str, dict[str, Any]]] = []

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        self.delivered.append((queue, message))


class _EnvelopeTransport(virtual.Transport):
    Channel = _EnvelopeChannel
    driver_type = driver_name = "stare-envelope"


class CeleryJobQueue:
    """Sends `task_name(job_id)` to a queue on the broker. The Celery app is built on first use."""

    def __init__(
        self, broker_url: str, task_name: str, *, timeout_s: float = 2.0, broker_folder: str | None = None
    ) -> None:
        self.broker_url = broker_url
        self.broker_folder = broker_folder
        self.task_name = task_name
        self.timeout_s = timeout_s
        self._app: Any = None
        self._lock = threading.Lock()
        self._redis: tuple[asyncio.AbstractEventLoop, Any] | None = None  # (its loop, an asyncio client)
        self._envelopes: tuple[kombu.Connection, kombu.Producer] | None = None

    def _celery(self) -> Any:
        with self._lock:
            if self._app is None:
                import celery

                app = celery.Celery("stare-service", broker=self.broker_url, set_as_current=False)
                app.conf.update(
                    broker_connection_timeout=self.timeout_s,
                    broker_connection_retry_on_startup=False,
                    broker_transport_options=broker_transport_options(
                        self.broker_url, self.broker_folder, self.timeout_s
                    ),
                    task_ignore_result=True,
                )
                self._app = app
            return self._app

    def enqueue(self, job_id: str, queue: str) -> bool:
        try:
            self._celery().send_task(
                self.task_name,
                args=[job_id],
                queue=queue,
                retry=True,
                retry_policy={
                    "max_retries": 1,
                    "interval_start": 0,
                    "interval_step": 0.2,
                    "interval_max": 0.2,
                },
            )
        except Exception:  # the broker is a doorbell: a lost ring is repaired by the sweeper
            logger.exception("could not enqueue job %s on %s; the sweeper will re-send it", job_id, queue)
            return False
        return True

    @property
    def pushes_from_the_loop(self) -> bool:
        """Whether enqueue_async pushes the message itself (a Redis broker) or calls send_task in a thread."""
        return urlsplit(self.broker_url).scheme in REDIS_SCHEMES

    async def enqueue_async(self, job_id: str, queue: str) -> bool:
        """`enqueue` from the event loop: the same message and the same failure handling."""
        if not self.pushes_from_the_loop:
            return await run_in_threadpool(self.enqueue, job_id, queue)
        try:
            await self._redis_client().lpush(queue, self.redis_message(job_id, queue))
        except Exception:  # the broker is a doorbell: a lost ring is repaired by the sweeper
            logger.exception("could not enqueue job %s on %s; the sweeper will re-send it", job_id, queue)
            return False
        return True

    def redis_message(self, job_id: str, queue: str) -> bytes:
        """What `send_task(task_name, args=[job_id], queue=queue)` pushes onto a Redis broker's list `queue`:
        Celery's task message in kombu's envelope, both built by them (see the module docstring)."""
        app = self._celery()
        headers, properties, body, _ = app.amqp.create_task_message(
            str(uuid.uuid4()), self.task_name, [job_id], {}, reply_to=app.thread_oid, ignore_result=None
        )
        producer = self._envelope_producer()
        producer.publish(
            body,
            exchange="",  # the default exchange: the routing key names the queue (a direct queue)
            routing_key=queue,
            serializer=app.conf.task_serializer,
            delivery_mode=kombu.entity.PERSISTENT_DELIVERY_MODE,
            headers=headers,
            retry=False,
            **properties,
        )
        channel = producer.channel
        delivered_to, message = channel.delivered.pop()
        assert delivered_to == queue and not channel.delivered
        return kombu_json.dumps(message).encode("utf-8")

    def _envelope_producer(self) -> kombu.Producer:
        """A kombu producer on a channel that keeps what it is given (built once; it does no I/O)."""
        if self._envelopes is None:
            connection = kombu.Connection(transport=_EnvelopeTransport)
            self._envelopes = (connection, kombu.Producer(connection.default_channel, auto_declare=False))
        return self._envelopes[1]

    def _redis_client(self) -> Any:
        """An asyncio Redis client of the running loop (tests run several loops; production one)."""
        loop = asyncio.get_running_loop()
        if self._redis is None or self._redis[0] is not loop:
            import redis.asyncio
            from redis.asyncio.retry import Retry
            from redis.backoff import ConstantBackoff

            client = redis.asyncio.Redis.from_url(
                self.broker_url,
                socket_timeout=self.timeout_s,
                socket_connect_timeout=self.timeout_s,
                retry=Retry(ConstantBackoff(0.2), 1),  # send_task's policy above: one retry after 0.2 s
            )
            self._redis = (loop, client)
        return self._redis[1]

    def ping(self) -> None:
        with self._celery().connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=self.timeout_s)

    def close(self) -> None:
        with self._lock:
            if self._app is not None:
                self._app.close()
                self._app = None
        envelopes, self._envelopes = self._envelopes, None
        if envelopes is not None:
            envelopes[0].release()

    async def aclose(self) -> None:
        redis, self._redis = self._redis, None
        if redis is not None and redis[0] is asyncio.get_running_loop():
            await redis[1].aclose()


@dataclass
class RecordingJobQueue:
    """Keeps (job_id, queue) in memory instead of sending: for tests about something other than the queue."""

    sent: list[tuple[str, str]] = field(default_factory=list)

    def enqueue(self, job_id: str, queue: str) -> bool:
        self.sent.append((job_id, queue))
        return True

    async def enqueue_async(self, job_id: str, queue: str) -> bool:
        return self.enqueue(job_id, queue)

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
