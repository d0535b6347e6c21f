"""The client against a hostile server: a real HTTP server on 127.0.0.1 (a thread) serving crafted
checkpoint listings and archives, whose digests match what it sends.

Every archive is downloaded with the real `Client.checkpoints.download` into a fresh folder; for each, the
download is refused with a typed error, nothing lands outside, the destination's folder is left empty (no
partial folder, no temp file), and the bytes this process wrote to files (/proc/self/io `wchar`, which counts write() and not socket sends)
and the Python memory it allocated (tracemalloc's peak) stay far below what the archive would unpack to.
The credential tests check that the API key reaches no origin but the API's, by listing or by redirect.
"""

from __future__ import annotations

import asyncio
import bz2
import hashlib
import io
import lzma
import re
import tarfile
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stare_client import (
    ArchiveTooLarge,
    AsyncClient,
    ChecksumMismatch,
    Client,
    ConnectionError,
    StareError,
    UnsafeArchive,
    UntrustedOrigin,
)
from stare_client.unpack import STREAM_SLACK_BYTES, ArchiveLimits
from tests.client.hostile import (
    BOMB_BYTES,
    JOB,
    KEY,
    MIB,
    TOP,
    HostileServer,
    Reply,
    announces_terabytes,
    entries,
    good_checkpoint,
    gzip_bomb,
    gzip_shards_bomb,
    huge_pax_header,
    many_members,
    multistream_bomb,
    negative_size,
    put,
    sparse_bomb,
    special,
    tar_in_tar,
    tar_of,
    truncated_gzip,
    truncated_member,
    xz_compress,
)

MEMORY_BUDGET_BYTES = 24 * MIB  # tracemalloc's peak during one download


@dataclass(frozen=True)
class Case:
    archive: Callable[[], bytes]
    error: type[StareError]
    match: str
    limits: ArchiveLimits | None = None
    announced_bytes: int | None = None  # the listing's `bytes`; None: what the archive claims to unpack to


ESCAPE = "escape-target"
CASES: dict[str, Case] = {
    "gzip bomb": Case(
        gzip_bomb, ArchiveTooLarge, "past the cap|compression bomb", announced_bytes=BOMB_BYTES
    ),
    "gzip bomb of 512 one-MiB members": Case(
        gzip_shards_bomb, ArchiveTooLarge, "past the cap|compression bomb", announced_bytes=BOMB_BYTES
    ),
    "xz bomb": Case(
        lambda: multistream_bomb(xz_compress),
        ArchiveTooLarge,
        "past the cap|compression bomb",
        announced_bytes=BOMB_BYTES,
    ),
    "bzip2 bomb": Case(
        lambda: multistream_bomb(bz2.compress),
        ArchiveTooLarge,
        "past the cap|compression bomb",
        announced_bytes=BOMB_BYTES,
    ),
    "sparse member": Case(sparse_bomb, ArchiveTooLarge, "model.bin.*past the cap", announced_bytes=2**31),
    "pax size of a terabyte": Case(lambda: tar_of(announces_terabytes), ArchiveTooLarge, "past the cap"),
    "huge pax header": Case(huge_pax_header, UnsafeArchive, "bytes of metadata"),
    "over the announced size": Case(
        lambda: tar_of(good_checkpoint), ArchiveTooLarge, "past the cap", announced_bytes=100
    ),
    "over the client's cap": Case(
        lambda: tar_of(good_checkpoint),
        ArchiveTooLarge,
        "past the cap",
        limits=ArchiveLimits(max_unpacked_bytes=4096),
    ),
    "many tiny members": Case(
        lambda: tar_of(many_members), UnsafeArchive, "more than 100 members", ArchiveLimits(max_members=100)
    ),
    "deep path": Case(lambda: tar_of(entries((TOP + "/d" * 40 + "/x", b"x"))), UnsafeArchive, "depth 42"),
    "long name": Case(
        lambda: tar_of(entries((f"{TOP}/{'n' * 300}", b"x"))), UnsafeArchive, "longer than 255 bytes"
    ),
    "symlink": Case(
        lambda: tar_of(special(tarfile.SYMTYPE, f"{TOP}/model", f"../../../{ESCAPE}")),
        UnsafeArchive,
        "symbolic link",
    ),
    "hard link": Case(
        lambda: tar_of(special(tarfile.LNKTYPE, f"{TOP}/x", f"{TOP}/state.json")), UnsafeArchive, "hard link"
    ),
    "character device": Case(lambda: tar_of(special(tarfile.CHRTYPE, f"{TOP}/tty")), UnsafeArchive, "device"),
    "block device": Case(lambda: tar_of(special(tarfile.BLKTYPE, f"{TOP}/sda")), UnsafeArchive, "device"),
    "fifo": Case(lambda: tar_of(special(tarfile.FIFOTYPE, f"{TOP}/pipe")), UnsafeArchive, "FIFO"),
    "absolute path": Case(
        lambda: tar_of(lambda tar: put(tar, f"/tmp/{ESCAPE}")), UnsafeArchive, "absolute path"
    ),
    "dot-dot": Case(
        lambda: tar_of(lambda tar: put(tar, f"{TOP}/../../../../{ESCAPE}")), UnsafeArchive, r"\.\."
    ),
    "duplicate name": Case(
        lambda: tar_of(entries((f"{TOP}/state.json", b"{}"), (f"{TOP}/state.json", b"[]"))),
        UnsafeArchive,
        "appears twice",
    ),
    "directory then file": Case(
        lambda: tar_of(entries((f"{TOP}/model", None), (f"{TOP}/model", b"a file"))),
        UnsafeArchive,
        "appears twice",
    ),
    "an implied folder then a file": Case(
        lambda: tar_of(entries((f"{TOP}/model/config.json", b"{}"), (f"{TOP}/model", b"a file"))),
        UnsafeArchive,
        "appears twice",
    ),
    "negative size": Case(negative_size, UnsafeArchive, "negative size"),
    "file then a member under it": Case(
        lambda: tar_of(entries((f"{TOP}/model", b"a file"), (f"{TOP}/model/config.json", b"{}"))),
        UnsafeArchive,
        "which is a file",
    ),
    "two top folders": Case(
        lambda: tar_of(lambda tar: put(tar, "other/state.json")), UnsafeArchive, "one top-level folder"
    ),
    "tar inside a tar": Case(tar_in_tar, UnsafeArchive, "not the checkpoint's top folder"),
    "truncated member": Case(truncated_member, UnsafeArchive, "truncated"),
    "truncated gzip": Case(truncated_gzip, UnsafeArchive, "truncated or corrupt"),
    "not a tar": Case(lambda: b"<html>surprise</html>" * 50, UnsafeArchive, "truncated or corrupt|empty"),
}


@pytest.fixture
def server() -> Iterator[HostileServer]:
    running = HostileServer()
    yield running
    running.close()


@pytest.fixture
def other() -> Iterator[HostileServer]:
    """A second origin (another port): where a hostile listing or redirect sends the client."""
    running = HostileServer()
    yield running
    running.close()


def written_bytes() -> int:
    """Bytes this process has passed to write() so far (files; socket sends are not counted)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


@dataclass
class Measured:
    written_bytes: int = 0
    peak_memory_bytes: int = 0


@pytest.fixture
def measure() -> Callable[[Callable[[], Any]], Measured]:
    def run(action: Callable[[], Any]) -> Measured:
        tracemalloc.start()
        before = written_bytes()
        try:
            action()
        finally:
            after = written_bytes()
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        return Measured(after - before, peak)

    return run


# -------------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_archive_is_refused_leaving_nothing(
    name: str,
    server: HostileServer,
    tmp_path: Path,
    measure: Callable[[Callable[[], Any]], Measured],
) -> None:
    case = CASES[name]
    archive = case.archive()
    server.checkpoint(archive, announced_bytes=case.announced_bytes)
    dest = tmp_path / "dest"
    dest.mkdir()
    caught: list[BaseException] = []

    def download() -> None:
        with Client(server.url, KEY, max_retries=0, archive_limits=case.limits) as client:
            try:
                client.checkpoints.download(JOB, "latest", dest / "ckpt")
            except StareError as err:
                caught.append(err)

    used = measure(download)
    assert caught, f"{name}: the download was accepted"
    assert isinstance(caught[0], case.error), repr(caught[0])
    assert re.search(case.match, str(caught[0])), str(caught[0])
    assert list(dest.iterdir()) == [], f"{name}: left behind {list(dest.iterdir())}"
    assert not (tmp_path / ESCAPE).exists() and not Path(f"/tmp/{ESCAPE}").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]
    limits = case.limits or ArchiveLimits()
    cap = min(limits.max_unpacked_bytes, int(limits.max_ratio * len(archive)) + STREAM_SLACK_BYTES)
    assert used.written_bytes <= len(archive) + cap, (name, used, cap)  # the archive, then at most the cap
    assert used.peak_memory_bytes < MEMORY_BUDGET_BYTES, (name, used)


def test_each_bomb_is_small_on_the_wire_and_huge_unpacked() -> None:
    """The bombs are what they claim: under 600 KB that decompress to a 512 MiB member (a 2 GiB one for the
    sparse member, from 10 KB)."""
    decompressors: dict[str, Callable[[], Any]] = {
        "gzip bomb": lambda: zlib.decompressobj(31),
        "xz bomb": lzma.LZMADecompressor,
        "bzip2 bomb": bz2.BZ2Decompressor,
    }
    for name, fresh in decompressors.items():
        archive = CASES[name].archive()
        assert len(archive) < 600_000, (name, len(archive))
        head = fresh().decompress(archive[:4096])
        member = tarfile.TarInfo.frombuf(head[512:1024], "utf-8", "surrogateescape")
        assert member.size == BOMB_BYTES, (name, member.size)
    archive = CASES["gzip bomb"].archive()
    unpacked = zlib.decompressobj(31)
    total = sum(len(unpacked.decompress(archive[i : i + 65536])) for i in range(0, len(archive), 65536))
    assert total >= BOMB_BYTES and unpacked.eof  # a whole, valid gzip stream
    assert len(sparse_bomb()) <= tarfile.RECORDSIZE  # 10 KB
    with tarfile.open(fileobj=io.BytesIO(sparse_bomb()), mode="r:") as tar:
        assert max(m.size for m in tar.getmembers()) == 2 * 1024 * MIB  # logical


def test_a_good_checkpoint_unpacks_and_modes_are_normalised(server: HostileServer, tmp_path: Path) -> None:
    def add(tar: tarfile.TarFile) -> None:
        good_checkpoint(tar)
        put(tar, f"{TOP}/nested.tar", tar_of(good_checkpoint), mode=0o4777)  # a tar in the tree: a file

    archive = tar_of(add)
    server.checkpoint(archive, announced_bytes=None)
    with Client(server.url, KEY, max_retries=0) as client:
        got = client.checkpoints.download(JOB, "latest", tmp_path / "ckpt")
    assert got.kind == "model" and got.sha256 == hashlib.sha256(archive).hexdigest()
    nested = tmp_path / "ckpt" / "nested.tar"
    assert nested.read_bytes() == tar_of(good_checkpoint) and nested.stat().st_mode & 0o7777 == 0o644
    assert (tmp_path / "ckpt" / "model" / "model.safetensors").read_bytes() == bytes(range(256)) * 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_digest_that_does_not_match_is_refused(server: HostileServer, tmp_path: Path) -> None:
    archive = tar_of(good_checkpoint)
    server.checkpoint(archive, headers={"X-Content-SHA256": "0" * 64})
    with Client(server.url, KEY, max_retries=0) as client, pytest.raises(ChecksumMismatch, match="announced"):
        client.checkpoints.download(JOB, "latest", tmp_path / "ckpt")
    server.checkpoint(archive, listing_sha256="1" * 64)  # the header matches, the listing does not
    with Client(server.url, KEY, max_retries=0) as client, pytest.raises(ChecksumMismatch, match="listing"):
        client.checkpoints.download(JOB, "latest", tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_a_length_that_does_not_match_is_refused(server: HostileServer, tmp_path: Path) -> None:
    archive = tar_of(good_checkpoint)
    server.checkpoint(archive, content_length=len(archive) + 1000)  # promises more than it sends
    with Client(server.url, KEY, max_retries=0) as client, pytest.raises(ConnectionError):
        client.checkpoints.download(JOB, "latest", tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_an_unannounced_body_is_cut_at_the_clients_cap(
    server: HostileServer, tmp_path: Path, measure: Callable[[Callable[[], Any]], Measured]
) -> None:
    limits = ArchiveLimits(max_unpacked_bytes=64 * 1024, max_members=8)
    server.checkpoint(b"\0" * (16 * MIB), content_length=None)  # no Content-Length: ends when it closes
    caught: list[BaseException] = []

    def download() -> None:
        with Client(server.url, KEY, max_retries=0, archive_limits=limits) as client:
            try:
                client.checkpoints.download(JOB, "latest", tmp_path / "ckpt")
            except StareError as err:
                caught.append(err)

    used = measure(download)
    assert caught and isinstance(caught[0], ArchiveTooLarge) and "this client limit" in str(caught[0])
    assert list(tmp_path.iterdir()) == []
    assert used.written_bytes < 16 * MIB + 2 * MIB  # the server's socket writes; the file got at most the cap


def test_an_announced_length_over_the_cap_is_refused_before_the_body(
    server: HostileServer, tmp_path: Path
) -> None:
    limits = ArchiveLimits(max_unpacked_bytes=64 * 1024, max_members=8)
    server.checkpoint(tar_of(good_checkpoint), content_length=10**12)
    with (
        Client(server.url, KEY, max_retries=0, archive_limits=limits) as client,
        pytest.raises(ArchiveTooLarge, match="announces a 1000000000000-byte archive"),
    ):
        client.checkpoints.download(JOB, "latest", tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_async_client_refuses_a_bomb_too(server: HostileServer, tmp_path: Path) -> None:
    server.checkpoint(gzip_bomb(), announced_bytes=BOMB_BYTES)

    with pytest.raises(ArchiveTooLarge):
        async_download(server.url, tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------- credentials


def listing_points_at(server: HostileServer, other: HostileServer) -> str:
    """The API's listing names a download on the other origin (which serves a good archive there)."""
    archive = tar_of(good_checkpoint)
    stolen = other.checkpoint(archive)
    server.checkpoint(archive, download_url=f"{other.url}{stolen}")
    return stolen


def async_download(url: str, target: Path) -> None:
    async def download() -> None:
        async with AsyncClient(url, KEY, max_retries=0) as client:
            await client.checkpoints.download(JOB, "latest", target)

    asyncio.run(download())


def test_a_listing_naming_another_origin_gets_no_key_and_no_request(
    server: HostileServer, other: HostileServer, tmp_path: Path
) -> None:
    listing_points_at(server, other)
    with (
        Client(server.url, KEY, max_retries=0) as client,
        pytest.raises(UntrustedOrigin, match="download_url"),
    ):
        client.checkpoints.download(JOB, "latest", tmp_path / "ckpt")
    assert other.requests == [] and server.keys_seen() == [f"Bearer {KEY}"]
    assert list(tmp_path.iterdir()) == []

    with pytest.raises(UntrustedOrigin):
        async_download(server.url, tmp_path / "ckpt")
    assert other.requests == []


def test_a_named_download_origin_is_fetched_without_the_key(
    server: HostileServer, other: HostileServer, tmp_path: Path
) -> None:
    stolen = listing_points_at(server, other)
    with Client(server.url, KEY, max_retries=0, download_origins=[other.url]) as client:
        got = client.checkpoints.download(JOB, "latest", tmp_path / "ckpt")
    assert got.kind == "model"
    assert [path for path, _ in other.requests] == [stolen] and other.keys_seen() == []


def test_a_redirect_to_another_origin_is_refused_or_followed_without_the_key(
    server: HostileServer, other: HostileServer, tmp_path: Path
) -> None:
    archive = tar_of(good_checkpoint)
    elsewhere = other.checkpoint(archive)
    path = server.checkpoint(archive)
    server.routes[path] = Reply(status=302, headers={"Location": f"{other.url}{elsewhere}"})
    with Client(server.url, KEY, max_retries=0) as client, pytest.raises(UntrustedOrigin, match="redirect"):
        client.checkpoints.download(JOB, "latest", tmp_path / "ckpt")
    assert other.requests == []
    with Client(server.url, KEY, max_retries=0, download_origins=[other.url]) as client:
        assert client.checkpoints.download(JOB, "latest", tmp_path / "ckpt").kind == "model"
    assert len(other.requests) == 1 and other.keys_seen() == []
    assert all(headers.get("authorization") == f"Bearer {KEY}" for _, headers in server.requests)


def test_a_same_origin_redirect_is_followed_with_the_key(server: HostileServer, tmp_path: Path) -> None:
    archive = tar_of(good_checkpoint)
    path = server.checkpoint(archive)
    server.routes["/moved"] = server.routes[path]
    server.routes[path] = Reply(status=307, headers={"Location": "/moved"})
    with Client(server.url, KEY, max_retries=0) as client:
        assert client.checkpoints.download(JOB, "latest", tmp_path / "ckpt").kind == "model"
    assert [p for p, _ in server.requests][-2:] == [path, "/moved"]
    assert server.keys_seen() == [f"Bearer {KEY}"] * len(server.requests)


def test_no_request_to_another_origin_carries_the_key(server: HostileServer, other: HostileServer) -> None:
    other.routes["/v1/me"] = Reply(b"{}")
    with Client(server.url, KEY, max_retries=0) as client:
        client.send("GET", f"{other.url}/v1/me")
    assert len(other.requests) == 1 and other.keys_seen() == []


@pytest.mark.parametrize("hostile", ["bomb", "another origin"])
def test_the_command_prints_one_line_and_exits_1(
    hostile: str,
    server: HostileServer,
    other: HostileServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from stare_client.cli import Exit, main

    if hostile == "bomb":
        server.checkpoint(gzip_bomb(), announced_bytes=BOMB_BYTES)
        expected = "compression bomb|past the cap"
    else:
        listing_points_at(server, other)
        expected = "not the API's origin"
    argv = [
        "--url",
        server.url,
        "--api-key",
        KEY,
        "checkpoints",
        "download",
        JOB,
        "--to",
        str(tmp_path / "c"),
        "-o",
        "json",  # no progress bar: stderr holds only what went wrong
    ]
    assert main(argv) == Exit.ERROR
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and re.search(expected, lines[0]), lines
    assert list(tmp_path.iterdir()) == [] and other.requests == []
