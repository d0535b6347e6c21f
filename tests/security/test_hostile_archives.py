"""The client against a hostile server: a real HTTP server on 127.0.0.1 (a thread) serving crafted
checkpoint listings and archives, whose digests match what it sends.

Every archive is downloaded with the real `Client.checkpoints.download` into a fresh folder; for each, the
download is refused with a typed error, nothing lands outside, the destination's folder is left empty (no
partial folder, no temp file), and the bytes this process wrote (/proc/self/io `wchar`: files and sockets)
and the Python memory it allocated (tracemalloc's peak) stay far below what the archive would unpack to.
The credential tests check that the API key reaches no origin but the API's, by listing or by redirect.
"""

from __future__ import annotations

import asyncio
import bz2
import contextlib
import functools
import hashlib
import io
import json
import lzma
import re
import tarfile
import threading
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
from stare_client.unpack import ArchiveLimits

KEY = "sk-stare-hostile-test-secret"
JOB = "job_hostile"
TOP = f"{JOB}-step-000002"
MIB = 1024 * 1024
BOMB_BYTES = 512 * MIB  # what each compression bomb unpacks to
WRITE_BUDGET_BYTES = 24 * MIB  # what a refused bomb may cost in writes (files and sockets), all told
MEMORY_BUDGET_BYTES = 24 * MIB  # tracemalloc's peak during one download

# ----------------------------------------------------------------------------------------------- archives


def tar_of(add: Callable[[tarfile.TarFile], None], *, top: bool = True) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if top:
            folder = tarfile.TarInfo(TOP)
            folder.type = tarfile.DIRTYPE
            tar.addfile(folder)
        add(tar)
    return buf.getvalue()


def put(tar: tarfile.TarFile, name: str, data: bytes = b"x", **attrs: Any) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in attrs.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data))


def entries(*items: tuple[str, bytes | None]) -> Callable[[tarfile.TarFile], None]:
    """Members in order: (name, data) is a file, (name, None) a folder."""

    def add(tar: tarfile.TarFile) -> None:
        for name, data in items:
            if data is None:
                info = tarfile.TarInfo(name)
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                put(tar, name, data)

    return add


def special(kind: bytes, name: str, linkname: str = "") -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        put(tar, f"{TOP}/state.json", b"{}")
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = linkname
        tar.addfile(info)

    return add


def good_checkpoint(tar: tarfile.TarFile) -> None:
    put(tar, f"{TOP}/model/config.json", b'{"model_type": "tiny"}')
    put(tar, f"{TOP}/model/model.safetensors", bytes(range(256)) * 64)
    put(tar, f"{TOP}/state.json", b'{"step": 2}')


def bomb_parts(logical_bytes: int) -> tuple[bytes, bytes, bytes]:
    """(tar header, one MiB of zeros, tar trailer): the tar of one member of `logical_bytes` zeros is the
    header, logical_bytes / MiB zero chunks, and the trailer."""
    info = tarfile.TarInfo(f"{TOP}/model/model.safetensors")
    info.size = logical_bytes
    folder = tarfile.TarInfo(TOP)
    folder.type = tarfile.DIRTYPE
    head = folder.tobuf(tarfile.PAX_FORMAT) + info.tobuf(tarfile.PAX_FORMAT)
    return head, bytes(MIB), bytes(2 * tarfile.BLOCKSIZE + tarfile.RECORDSIZE)


@functools.cache
def gzip_bomb(logical_bytes: int = BOMB_BYTES) -> bytes:
    """A gzip stream built from one compressed MiB of zeros repeated: after a full flush deflate restarts, so
    the same bytes stand for every MiB (compressing 512 MiB for real takes seconds)."""
    head, zeros, tail = bomb_parts(logical_bytes)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = c.compress(head) + c.flush(zlib.Z_FULL_FLUSH)
    chunk = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    last = c.compress(tail) + c.flush(zlib.Z_FINISH)
    chunks = logical_bytes // MIB
    crc = zlib.crc32(head)
    for _ in range(chunks):
        crc = zlib.crc32(zeros, crc)
    crc = zlib.crc32(tail, crc)
    size = (len(head) + chunks * MIB + len(tail)) % 2**32
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + first + chunk * chunks + last + crc.to_bytes(4, "little") + size.to_bytes(4, "little")


def xz_compress(data: bytes) -> bytes:
    return lzma.compress(data, preset=0)


@functools.cache
def multistream_bomb(compress: Callable[[bytes], bytes], logical_bytes: int = BOMB_BYTES) -> bytes:
    """bzip2 and xz readers accept concatenated streams: one stream per MiB of zeros, the same bytes."""
    head, zeros, tail = bomb_parts(logical_bytes)
    return compress(head) + compress(zeros) * (logical_bytes // MIB) + compress(tail)


def sparse_bomb(logical_bytes: int = 2 * 1024 * MIB) -> bytes:
    """A GNU sparse (pax 1.0) member: a 512-byte map and one data block stand for `logical_bytes`."""

    def add(tar: tarfile.TarFile) -> None:
        data = b"1\n0\n512\n".ljust(tarfile.BLOCKSIZE, b"\0") + b"s" * tarfile.BLOCKSIZE
        info = tarfile.TarInfo(f"{TOP}/GNUSparseFile.0/model.bin")
        info.size = len(data)
        info.pax_headers = {
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": f"{TOP}/model.bin",
            "GNU.sparse.realsize": str(logical_bytes),
        }
        tar.addfile(info, io.BytesIO(data))

    return tar_of(add)


def huge_pax_header() -> bytes:
    """An extended header announcing 64 MiB of pax records, of which 1 MiB follow; tarfile would ask for the
    64 MiB in one read (and hold them in memory)."""
    folder = tarfile.TarInfo(TOP)
    folder.type = tarfile.DIRTYPE
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type = tarfile.XHDTYPE
    pax.size = 64 * MIB
    raw = folder.tobuf(tarfile.USTAR_FORMAT) + pax.tobuf(tarfile.USTAR_FORMAT)
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = c.compress(raw)
    body += c.compress(b"9 a=b\n" * (MIB // 6))
    return body + c.flush()


def many_members(tar: tarfile.TarFile) -> None:
    for i in range(150):
        put(tar, f"{TOP}/f{i:05d}", b"")


def announces_terabytes(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo(f"{TOP}/model.safetensors")
    info.size = 16
    info.pax_headers = {"size": str(10**12)}
    tar.addfile(info, io.BytesIO(b"x" * 16))


def truncated_member() -> bytes:
    whole = tar_of(lambda tar: put(tar, f"{TOP}/model.safetensors", b"w" * 100_000))
    return whole[:50_000]


def truncated_gzip() -> bytes:
    whole = tar_of(good_checkpoint)
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    packed = c.compress(whole) + c.flush()
    return packed[: len(packed) // 2]


def tar_in_tar() -> bytes:
    inner = tar_of(good_checkpoint)
    return tar_of(lambda tar: put(tar, "inner.tar", inner), top=False)


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

# ------------------------------------------------------------------------------------------------- server


@dataclass
class Reply:
    body: bytes = b""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    content_length: int | None = -1  # -1: the body's length; None: none (the body ends at the close)


class HostileServer:
    """A real HTTP server on 127.0.0.1 answering each path with a canned Reply (or the next of a list, the last
    one repeating) and recording every request's path and headers."""

    def __init__(self) -> None:
        self.routes: dict[str, Reply | list[Reply]] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                server.requests.append((path, {k.lower(): v for k, v in self.headers.items()}))
                reply = server.routes.get(path, Reply(b'{"error": {"code": "not_found"}}', 404))
                if isinstance(reply, list):
                    reply = reply.pop(0) if len(reply) > 1 else reply[0]
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                if reply.content_length is not None:
                    length = len(reply.body) if reply.content_length < 0 else reply.content_length
                    self.send_header("Content-Length", str(length))
                self.end_headers()
                with contextlib.suppress(OSError):  # the client hung up (it refused the body)
                    self.wfile.write(reply.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def checkpoint(
        self,
        archive: bytes,
        *,
        announced_bytes: int | None = None,
        download_url: str | None = None,
        listing_sha256: str | None = None,
        **reply: Any,
    ) -> str:
        """List one checkpoint of JOB whose download is `archive` (its true SHA-256 in the header unless
        `reply` says otherwise); returns the download path."""
        path = f"/v1/jobs/{JOB}/checkpoints/ckpt_1/download"
        sha = hashlib.sha256(archive).hexdigest()
        listing = {
            "object": "list",
            "data": [
                {
                    "id": "ckpt_1",
                    "object": "job.checkpoint",
                    "job_id": JOB,
                    "step": 2,
                    "created_at": "2026-01-01T00:00:00Z",
                    "bytes": announced_bytes,
                    "sha256": listing_sha256,
                    "metrics": None,
                    "download_url": download_url or path,
                }
            ],
        }
        self.routes[f"/v1/jobs/{JOB}/checkpoints"] = Reply(json.dumps(listing).encode())
        headers = {"X-Content-SHA256": sha, "Content-Type": "application/x-tar", **reply.pop("headers", {})}
        self.routes[path] = Reply(archive, headers=headers, **reply)
        return path

    def keys_seen(self) -> list[str]:
        return [headers["authorization"] for _, headers in self.requests if "authorization" in headers]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


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
    """Bytes this process has passed to write() so far (files and sockets)."""
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
    assert used.written_bytes < WRITE_BUDGET_BYTES + 2 * len(archive), (name, used)
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
