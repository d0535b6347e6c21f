"""The client against a hostile server's listings and event stream (a real HTTP server on 127.0.0.1,
tests/client/hostile.py):

- a checkpoint listing whose job id is a path ("../../../x", an absolute path, a separator) makes no folder
  anywhere: the default download folder is built only from an id that matches the id pattern, in the sync
  client, the async client and `stare checkpoints download` without --to;
- one endless line, or one endless message of many lines, in the event stream is refused (code
  event_too_large) while the client holds a few MiB, in both clients.
"""

from __future__ import annotations

import asyncio
import json
import os
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stare_client import AsyncClient, Client, StareError
from stare_client.archive import JOB_ID, target_folder
from stare_client.transport import MAX_EVENT_BYTES, MAX_EVENT_LINE_BYTES, LineSplitter
from store.ids import id_pattern, new_id
from tests.client.hostile import JOB, KEY, MIB, HostileServer, Reply, good_checkpoint, tar_of

HOSTILE_IDS = [
    "../../../escaped",
    "/tmp/stare-absolute-escape",
    "job_01ARZ3NDEKTSV4RRFFQ69G5FAV/../../escaped",
    "job_01ARZ3NDEKTSV4RRFFQ69G5FAV\n",
    "job_..",
    "",
]


@pytest.fixture
def server() -> Iterator[HostileServer]:
    running = HostileServer()
    yield running
    running.close()


def list_as(server: HostileServer, job_id: str, step: int = 2) -> None:
    """The checkpoint of JOB listed under another job id (and step)."""
    server.checkpoint(tar_of(good_checkpoint))
    path = f"/v1/jobs/{JOB}/checkpoints"
    reply = server.routes[path]
    assert isinstance(reply, Reply)
    listing = json.loads(reply.body)
    listing["data"][0].update(job_id=job_id, step=step)
    server.routes[path] = Reply(json.dumps(listing).encode())


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """The current folder of the test: tmp_path/a/b/work, so that ../../../x stays inside tmp_path."""
    work = tmp_path / "a" / "b" / "work"
    work.mkdir(parents=True)
    before = Path.cwd()
    os.chdir(work)
    try:
        yield work
    finally:
        os.chdir(before)


def everything_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_the_client_pattern_is_the_servers() -> None:
    assert JOB_ID.pattern == id_pattern("job").strip("^$")
    assert JOB_ID.fullmatch(new_id("job"))


@pytest.mark.parametrize("job_id", HOSTILE_IDS)
def test_a_listed_job_id_that_is_a_path_makes_no_folder(
    job_id: str, server: HostileServer, workdir: Path, tmp_path: Path
) -> None:
    list_as(server, job_id)
    before = everything_under(tmp_path)
    with Client(server.url, KEY, max_retries=0) as client, pytest.raises(StareError) as caught:
        client.checkpoints.download(JOB)
    assert caught.value.code == "bad_job_id" and "not a job id" in str(caught.value)

    async def download() -> None:
        async with AsyncClient(server.url, KEY, max_retries=0) as client:
            await client.checkpoints.download(JOB)

    with pytest.raises(StareError) as caught_async:
        asyncio.run(download())
    assert caught_async.value.code == "bad_job_id"
    assert everything_under(tmp_path) == before == ["a", "a/b", "a/b/work"]
    assert not Path("/tmp/stare-absolute-escape-step-000002").exists()


def test_the_command_without_to_refuses_a_path_as_job_id(
    server: HostileServer, workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stare_client.cli import Exit, main

    list_as(server, "../../../escaped")
    argv = ["--url", server.url, "--api-key", KEY, "checkpoints", "download", JOB, "-o", "json"]
    assert main(argv) == Exit.ERROR
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "not a job id" in lines[0], lines
    assert everything_under(tmp_path) == ["a", "a/b", "a/b/work"]


def test_a_listed_job_id_of_the_pattern_lands_in_the_working_folder(
    server: HostileServer, workdir: Path
) -> None:
    job_id = new_id("job")
    list_as(server, job_id)
    with Client(server.url, KEY, max_retries=0) as client:
        got = client.checkpoints.download(JOB)
    assert got.root == workdir.resolve() / f"{job_id}-step-000002"
    assert (got.root / "model" / "config.json").is_file()
    assert [p.name for p in workdir.iterdir()] == [got.root.name]


def test_a_default_folder_that_is_a_link_out_is_refused(workdir: Path, tmp_path: Path) -> None:
    job_id = new_id("job")
    outside = tmp_path / "outside"
    outside.mkdir()
    (workdir / f"{job_id}-step-000002").symlink_to(outside)
    with pytest.raises(StareError) as caught:
        target_folder(None, job_id, 2)
    assert caught.value.code == "outside_folder"
    with pytest.raises(StareError, match="step"):
        target_folder(None, job_id, -1)


# ------------------------------------------------------------------------------------------- event stream


def stream_of(body: bytes) -> Reply:
    return Reply(body, headers={"Content-Type": "text/event-stream"}, content_length=None)


ENDLESS_LINE = b"data: " + b"a" * (24 * MIB)
ENDLESS_EVENT = (b"data: " + b"b" * (MIB // 2) + b"\n") * 48  # 24 MiB of lines, no blank line
ENDLESS_CR_LINES = b"\r".join([b"data: " + b"c" * (MIB // 2)] * 48)  # lines ended by CR alone


def peak_while(action: Callable[[], Any]) -> tuple[BaseException | None, int]:
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


@pytest.mark.parametrize(
    ("body", "what"),
    [(ENDLESS_LINE, "a line"), (ENDLESS_EVENT, "one event"), (ENDLESS_CR_LINES, "one event")],
    ids=["one endless line", "one endless event", "CR-separated lines"],
)
def test_an_endless_stream_line_or_event_is_refused_in_both_clients(
    body: bytes, what: str, server: HostileServer
) -> None:
    server.routes["/v1/jobs/job_1/events"] = stream_of(body)

    def sync_follow() -> None:
        with Client(server.url, KEY, max_retries=0) as client:
            list(client.jobs.events("job_1", reconnect_for_s=1))

    def async_follow() -> None:
        async def run() -> None:
            async with AsyncClient(server.url, KEY, max_retries=0) as client:
                [e async for e in client.jobs.events("job_1", reconnect_for_s=1)]

        asyncio.run(run())

    for follow in (sync_follow, async_follow):
        caught, peak = peak_while(follow)
        assert isinstance(caught, StareError) and caught.code == "event_too_large", repr(caught)
        assert what in str(caught)
        assert peak < 3 * MAX_EVENT_BYTES, f"{follow.__name__} held {peak / MIB:.1f} MiB"


def test_lines_split_at_every_break_across_chunks() -> None:
    splitter = LineSplitter(16)
    got = splitter.feed(b"a\r") + splitter.feed(b"\nb\rc\n\nd") + splitter.feed(b"e\r") + splitter.feed(b"f")
    assert got + splitter.end() == ["a", "b", "c", "", "de", "f"]
    with pytest.raises(StareError, match="a line"):
        LineSplitter(4).feed(b"12345")
    assert MAX_EVENT_LINE_BYTES <= MAX_EVENT_BYTES
