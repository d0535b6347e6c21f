"""Issue 44, R7: the client bounds every response it reads whole (JSON, text, the report's HTML, an error's
body) by max_response_bytes (stare_client.transport.MAX_RESPONSE_BYTES, 64 MiB), with a clear error past it.

Before, a hostile server's 400 MiB checkpoint listing drove `Client.checkpoints.download` to 1,649 MiB of
memory, and `reports.html` likewise: httpx read every body whole. Against a hostile HTTP server on
127.0.0.1 (tests/client/hostile.py), with the limit lowered to 4 MiB so the bodies stay small here: an
announced length past it is refused before the body, a body without one at the limit, a gzip bomb by its
decompressed size; in the sync and the async client; each while the client holds a few times the limit.
"""

from __future__ import annotations

import asyncio
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stare_client import AsyncClient, Client, StareError
from stare_client.transport import MAX_RESPONSE_BYTES
from tests.client.hostile import JOB, KEY, MIB, HostileServer, Reply

LIMIT = 4 * MIB
LISTING = f"/v1/jobs/{JOB}/checkpoints"
REPORT = f"/v1/jobs/{JOB}/report"
HUGE_JSON = b'{"object": "list", "data": [' + b'{"id": "ckpt_x", "step": 1},' * (40 * MIB // 28) + b"{}]}"


def _gzip_bomb(size: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b" " * MIB
    return b"".join([packer.compress(chunk) for _ in range(size // MIB)] + [packer.flush()])


BOMB = _gzip_bomb(400 * MIB)

REPLIES = {
    "announced": Reply(HUGE_JSON, headers={"Content-Type": "application/json"}),
    "unannounced": Reply(HUGE_JSON, headers={"Content-Type": "application/json"}, content_length=None),
    "gzip bomb": Reply(BOMB, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}),
    "error body": Reply(HUGE_JSON, status=404, content_length=None),
}


@pytest.fixture
def server() -> Iterator[HostileServer]:
    running = HostileServer()
    yield running
    running.close()


def _peak(action: Callable[[], Any]) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    caught: BaseException | None = None
    try:
        action()
    except StareError as err:
        caught = err
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return caught, peak


def _both(call: Callable[[Any], Any]) -> list[Callable[[], Any]]:
    def sync(url: str) -> None:
        with Client(url, KEY, max_retries=0, max_response_bytes=LIMIT) as client:
            call(client)

    def asynchronous(url: str) -> None:
        async def run() -> None:
            async with AsyncClient(url, KEY, max_retries=0, max_response_bytes=LIMIT) as client:
                await call(client)

        asyncio.run(run())

    return [sync, asynchronous]  # type: ignore[list-item]


@pytest.mark.parametrize("kind", sorted(REPLIES))
def test_a_listing_past_the_limit_is_refused_while_little_is_held(
    kind: str, server: HostileServer, tmp_path: Path
) -> None:
    server.routes[LISTING] = REPLIES[kind]
    for run in _both(lambda client: client.checkpoints.download(JOB, "latest", str(tmp_path / "out"))):
        caught, peak = _peak(lambda run=run: run(server.url))
        assert isinstance(caught, StareError) and caught.code == "response_too_large", repr(caught)
        assert f"GET {LISTING} is larger than {LIMIT} bytes" in str(caught)
        assert peak < 3 * LIMIT, f"{kind}: held {peak / MIB:.1f} MiB"
    assert not (tmp_path / "out").exists()


def test_the_reports_html_past_the_limit_is_refused(server: HostileServer) -> None:
    page = b"<html>" + b"<p>x</p>" * (40 * MIB // 8) + b"</html>"
    server.routes[REPORT] = Reply(page, headers={"Content-Type": "text/html"}, content_length=None)
    for run in _both(lambda client: client.reports.html(JOB)):
        caught, peak = _peak(lambda run=run: run(server.url))
        assert isinstance(caught, StareError) and caught.code == "response_too_large", repr(caught)
        assert peak < 3 * LIMIT


def test_a_response_within_the_limit_reads_as_before(server: HostileServer) -> None:
    body = b'{"object": "list", "data": []}'
    server.routes[LISTING] = Reply(body, headers={"Content-Type": "application/json"})
    with Client(server.url, KEY, max_retries=0, max_response_bytes=len(body)) as client:
        assert client.checkpoints.list(JOB) == []
    small = Reply(_gzip_bomb(MIB), headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    server.routes[LISTING] = small  # a mebibyte of spaces: JSON it is not, but it is read whole to say so
    with (
        Client(server.url, KEY, max_retries=0, max_response_bytes=2 * MIB) as client,
        pytest.raises(StareError) as caught,
    ):
        client.checkpoints.list(JOB)
    assert caught.value.code == "bad_response"
    assert MAX_RESPONSE_BYTES == 64 * MIB
