"""A hostile checkpoint server for the client's tests: a real HTTP server on 127.0.0.1 (a thread) that
answers each path with a canned reply and records every request, and the crafted archives it serves
(compression bombs built in milliseconds, sparse members, malformed tars). Used by
tests/security/test_hostile_archives.py and tests/client/test_driver.py."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import lzma
import tarfile
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KEY = "sk-stare-hostile-test-secret"
JOB = "job_hostile"
TOP = f"{JOB}-step-000002"
MIB = 1024 * 1024
BOMB_BYTES = 512 * MIB  # what each compression bomb unpacks to

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


GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"


def gzip_of(pieces: list[tuple[bytes, int]]) -> bytes:
    """A gzip stream of each piece repeated its count of times. After a full flush deflate starts afresh, so
    a piece's compressed bytes stand for every repeat (compressing hundreds of MiB for real takes seconds)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    packed: dict[bytes, bytes] = {}
    body: list[bytes] = []
    crc = size = 0
    for data, count in pieces:
        if data not in packed:
            packed[data] = c.compress(data) + c.flush(zlib.Z_FULL_FLUSH)
        body.append(packed[data] * count)
        for _ in range(count):
            crc = zlib.crc32(data, crc)
        size += len(data) * count
    body.append(c.flush(zlib.Z_FINISH))
    return GZIP_HEADER + b"".join(body) + crc.to_bytes(4, "little") + (size % 2**32).to_bytes(4, "little")


@functools.cache
def gzip_bomb(logical_bytes: int = BOMB_BYTES) -> bytes:
    """One member of `logical_bytes` zeros."""
    head, zeros, tail = bomb_parts(logical_bytes)
    return gzip_of([(head, 1), (zeros, logical_bytes // MIB), (tail, 1)])


@functools.cache
def gzip_shards_bomb(shards: int = BOMB_BYTES // MIB) -> bytes:
    """`shards` members of one MiB of zeros each: no member is large, only their sum (the counting must
    happen while unpacking)."""
    folder = tarfile.TarInfo(TOP)
    folder.type = tarfile.DIRTYPE
    pieces = [(folder.tobuf(tarfile.PAX_FORMAT), 1)]
    zeros = bytes(MIB)
    for i in range(shards):
        shard = tarfile.TarInfo(f"{TOP}/model-{i:05d}.safetensors")
        shard.size = MIB
        pieces += [(shard.tobuf(tarfile.PAX_FORMAT), 1), (zeros, 1)]
    return gzip_of([*pieces, (bytes(2 * tarfile.BLOCKSIZE + tarfile.RECORDSIZE), 1)])


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


def negative_size() -> bytes:
    """A member whose size field is -1024 in base-256 (tarfile would seek backwards)."""
    raw = bytearray(tar_of(lambda tar: put(tar, f"{TOP}/state.json", b"{}")))
    header = raw[tarfile.BLOCKSIZE : 2 * tarfile.BLOCKSIZE]
    header[124:136] = b"\xff" + ((-1024) & (2**88 - 1)).to_bytes(11, "big")
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    raw[tarfile.BLOCKSIZE : 2 * tarfile.BLOCKSIZE] = header
    return bytes(raw)


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
