"""Downloads: a stored file's bytes (`stored_bytes`), and checkpoints: a stored folder streamed as a deterministic tar (sorted entries, fixed owner, the
files' own mtimes), so the sha256 of the stream is a property of the checkpoint: it is computed once, stored
on the row, and sent as a header before the body.

The bytes come through the artifact storage (store.artifacts.ArtifactStorage), by key: this module does not
know where they live.
"""

from __future__ import annotations

import hashlib
import tarfile
from collections.abc import Iterator
from urllib.parse import quote

from store.artifacts import ArtifactStorage, StoredFile

CHUNK_BYTES = 1024 * 1024


def stored_bytes(storage: ArtifactStorage, key: str) -> Iterator[bytes]:
    """A stored file's bytes, chunk by chunk (never whole in memory)."""
    with storage.open(key) as fh:
        while chunk := fh.read(CHUNK_BYTES):
            yield chunk


def attachment(filename: str) -> str:
    """A Content-Disposition that names the download (RFC 6266; percent-encoded when not plain ASCII)."""
    quoted = quote(filename)
    return (
        f'attachment; filename="{filename}"'
        if quoted == filename
        else f"attachment; filename*=utf-8''{quoted}"
    )


def _tar_header(name: str, size: int, mtime: int, *, directory: bool = False) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = 0 if directory else size
    info.mtime = mtime
    info.mode = 0o755 if directory else 0o644
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")


def checkpoint_archive_name(job_id: str, step: int) -> str:
    """The top folder inside a checkpoint's download (and the tar's file name without .tar). A worker that
    precomputes the digest for add_checkpoint(archive_sha256=...) must use the same name:
    archive_digest(storage, storage.walk(key), checkpoint_archive_name(job_id, step))."""
    return f"{job_id}-step-{step:06d}"


def checkpoint_archive(storage: ArtifactStorage, files: list[StoredFile], top: str) -> Iterator[bytes]:
    """A tar stream of `files` under the folder name `top`, produced chunk by chunk (never whole in memory)."""
    written = 0
    header = _tar_header(top + "/", 0, max((f.mtime for f in files), default=0), directory=True)
    written += len(header)
    yield header
    for item in files:
        header = _tar_header(f"{top}/{item.relative}", item.size, item.mtime)
        written += len(header)
        yield header
        remaining = item.size
        with storage.open(item.key) as fh:
            while remaining > 0:
                chunk = fh.read(min(CHUNK_BYTES, remaining))
                if not chunk:
                    raise OSError(f"{item.relative} shrank while it was being archived")
                remaining -= len(chunk)
                written += len(chunk)
                yield chunk
        padding = (-item.size) % tarfile.BLOCKSIZE
        if padding:
            written += padding
            yield b"\0" * padding
    trailer = 2 * tarfile.BLOCKSIZE
    trailer += (-(written + trailer)) % tarfile.RECORDSIZE
    yield b"\0" * trailer


def archive_digest(storage: ArtifactStorage, files: list[StoredFile], top: str) -> tuple[str, int]:
    """(sha256 hex, size) of checkpoint_archive(storage, files, top)."""
    digest = hashlib.sha256()
    size = 0
    for chunk in checkpoint_archive(storage, files, top):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def job_bytes(storage: ArtifactStorage, tenant_id: str, job_id: str) -> int:
    """Bytes of the job's files on the server: its run folder (checkpoints, events, report, logs); 0 before
    a worker made it."""
    key = f"{tenant_id}/{job_id}"
    return storage.size(key) if storage.exists(key) else 0
