"""The sync and async clients are one definition run by two drivers (stare_client/driver.py): against a
real HTTP server on 127.0.0.1 (tests/client/hostile.py), both give the same answers, the
same retries (a 503 then a 200, with on_retry) and the same events from a paged list and a live stream, and
an event stream abandoned half-way has its connection closed by the driver; a cancelled async call waits
for its blocking step (unpacking) before its cleanup runs."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from stare_client import AsyncClient, Client, RetryInfo
from stare_client.driver import AsyncCall, AsyncDriver, AsyncListing, Blocking, Op, SyncCall, SyncListing
from tests.client.hostile import KEY, HostileServer, Reply

EVENT = {"object": "job.event", "job_id": "job_1", "type": "job.step", "level": "info", "message": "step"}
STAMP = "2026-01-01T00:00:00Z"


def event(i: int) -> dict[str, Any]:
    return {**EVENT, "id": i, "step": i, "data": None, "created_at": STAMP}


def page(ids: list[int], has_more: bool) -> Reply:
    body = {"object": "list", "data": [event(i) for i in ids], "has_more": has_more, "last_id": ids[-1]}
    return Reply(json.dumps(body).encode())


def sse(ids: list[int], end: bool) -> Reply:
    text = "".join(f"id: {i}\nevent: job.step\ndata: {json.dumps(event(i))}\n\n" for i in ids)
    text += ": keep-alive\n\n" + ("event: end\ndata: \n\n" if end else "")
    return Reply(text.encode(), headers={"Content-Type": "text/event-stream"})


KEYS: dict[str, Any] = {
    "object": "list",
    "data": [
        {
            "id": "key_1",
            "object": "api_key",
            "name": "k",
            "prefix": "sk-stare-ab",
            "created_at": STAMP,
            "last_used_at": None,
            "revoked_at": None,
        }
    ],
}


def busy_then_keys() -> list[Reply]:
    return [Reply(b"busy", 503, {"Retry-After": "0"}), Reply(json.dumps(KEYS).encode())]


@pytest.fixture
def server() -> Iterator[HostileServer]:
    running = HostileServer()
    running.routes["/v1/api-keys"] = busy_then_keys()
    running.routes["/v1/jobs/job_1/events"] = [page([1, 2], True), page([3], False)]
    yield running
    running.close()


def test_both_clients_give_the_same_answers_and_retries(server: HostileServer) -> None:
    sync_retries: list[RetryInfo] = []
    with Client(server.url, KEY, backoff_s=0.01, on_retry=sync_retries.append) as client:
        assert isinstance(client.keys.list, SyncCall) and isinstance(client.jobs.events, SyncListing)
        sync_keys = client.keys.list()
        sync_events = [e.id for e in client.jobs.events("job_1", follow=False)]
    server.routes["/v1/api-keys"] = busy_then_keys()
    server.routes["/v1/jobs/job_1/events"] = [page([1, 2], True), page([3], False)]

    async_retries: list[RetryInfo] = []

    async def run() -> tuple[Any, list[int]]:
        async with AsyncClient(server.url, KEY, backoff_s=0.01, on_retry=async_retries.append) as client:
            assert isinstance(client.keys.list, AsyncCall) and isinstance(client.jobs.events, AsyncListing)
            keys = await client.keys.list()
            return keys, [e.id async for e in client.jobs.events("job_1", follow=False)]

    async_keys, async_events = asyncio.run(run())
    assert sync_keys == async_keys and [k.id for k in sync_keys] == ["key_1"]
    assert sync_events == async_events == [1, 2, 3]
    assert [(r.reason, r.attempt) for r in sync_retries] == [(r.reason, r.attempt) for r in async_retries]
    assert [r.reason for r in sync_retries] == ["HTTP 503"]
    assert all(headers.get("authorization") == f"Bearer {KEY}" for _, headers in server.requests)


def test_a_live_stream_reconnects_without_repeats_in_both_clients(server: HostileServer) -> None:
    def routes() -> None:  # a stream cut after 1, 2; the reconnect resends 2, skips 3, sends 4 and the end
        server.routes["/v1/jobs/job_1/events"] = [
            sse([1, 2], end=False),
            sse([2, 4], end=True),
            page([3], False),
        ]

    routes()
    with Client(server.url, KEY, backoff_s=0.01) as client:
        sync_ids = [e.id for e in client.jobs.events("job_1")]
    resumed = [h.get("last-event-id") for p, h in server.requests if p.endswith("/events")]
    routes()

    async def run() -> list[int]:
        async with AsyncClient(server.url, KEY, backoff_s=0.01) as client:
            return [e.id async for e in client.jobs.events("job_1")]

    assert sync_ids == asyncio.run(run()) == [1, 2, 3, 4]
    assert resumed[:2] == [None, "2"]  # the reconnect says where it stood; 3 came from the paged list


def test_an_abandoned_stream_is_closed_by_the_driver(server: HostileServer) -> None:
    server.routes["/v1/jobs/job_1/events"] = sse([1, 2, 3], end=False)
    with Client(server.url, KEY) as client:
        stream = client.jobs.events("job_1")
        assert next(stream).id == 1
        pool = client.http._transport._pool  # type: ignore[attr-defined]
        assert any(not c.is_idle() for c in pool.connections)  # the stream holds its connection
        stream.close()  # the caller stops early: the driver closes what the operation opened
        assert all(c.is_idle() or c.is_closed() for c in pool.connections)


def test_a_cancelled_async_call_waits_for_its_blocking_step() -> None:
    """A thread cannot be stopped: cancelling the caller while an unpack runs must not let the operation's
    cleanup race it, so the cancellation is delivered once the thread is done."""
    finished: list[float] = []

    def unpack() -> None:
        time.sleep(0.3)
        finished.append(time.monotonic())

    def op() -> Op[None]:
        yield Blocking(unpack)

    async def run() -> float:
        import httpx

        async with httpx.AsyncClient() as http:
            task = asyncio.create_task(AsyncDriver(http).run(op()))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return time.monotonic()

    cancelled_at = asyncio.run(run())
    assert finished and finished[0] <= cancelled_at
