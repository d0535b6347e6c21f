"""Artifact storage behind one small interface: uploaded files, run folders and checkpoints.

Keys are relative POSIX paths ("ten_x/files/file_y.jsonl", "ten_x/job_z/run/checkpoints/step-000050").
They come from database rows, never from request strings, and every key is still resolved and checked to
stay inside the root (defence in depth: a tampered row or a symlink planted in a run folder cannot reach
outside). LocalArtifactStorage keeps them in a directory; an object store can implement the same protocol.

`checkpoint_archive` streams a folder as a deterministic tar (sorted entries, fixed owner, the files' own
mtimes), so the sha256 of the stream is a property of the checkpoint: it is computed once, stored on the
row, and sent as a header before the body.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol

from service.errors import NotFound

CHUNK_BYTES = 1024 * 1024
STAGING_DIR = ".staging"  # same filesystem as the artifacts, so commit is a rename


class StorageKeyError(NotFound):
    """A key that is malformed or resolves outside the root. Reported as 404: there is nothing to serve."""

    code = "artifact_not_found"


@dataclass(frozen=True)
class StoredFile:
    relative: str  # POSIX path inside the archived folder
    size: int
    mtime: int
    path: Path


class ArtifactStorage(Protocol):
    def staged(self) -> AbstractContextManager[Path]:
        """A fresh local temp path, removed on exit unless commit() moved it into place."""
        ...

    def commit(self, staged: Path, key: str) -> None:
        """Move a staged file to `key` atomically (fsynced first)."""
        ...

    def open(self, key: str) -> BinaryIO: ...

    def exists(self, key: str) -> bool: ...

    def walk(self, key: str) -> list[StoredFile]: ...

    def delete(self, key: str) -> None: ...


def check_key(key: str) -> PurePosixPath:
    relative = PurePosixPath(key)
    if not key or relative.is_absolute() or ".." in relative.parts or "\\" in key or "\x00" in key:
        raise StorageKeyError(f"invalid artifact key {key!r}")
    return relative


class LocalArtifactStorage:
    """Artifacts in a local (or mounted) directory."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root.resolve()

    def resolve(self, key: str) -> Path:
        """The absolute path of a key, refusing anything that resolves outside the root."""
        candidate = (self.root / check_key(key)).resolve()
        if not candidate.is_relative_to(self.root):
            raise StorageKeyError(f"artifact key {key!r} resolves outside the artifact root")
        return candidate

    @contextmanager
    def staged(self) -> Iterator[Path]:
        staging = self.root / STAGING_DIR
        staging.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=staging, suffix=".partial")
        os.close(fd)
        try:
            yield Path(tmp)
        finally:
            with contextlib.suppress(OSError):  # a storage fault must not hide the error that led here
                Path(tmp).unlink(missing_ok=True)

    def commit(self, staged: Path, key: str) -> None:
        target = self.resolve(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        with staged.open("rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(staged, 0o644)
        os.replace(staged, target)

    def open(self, key: str) -> BinaryIO:
        path = self.resolve(key)
        if not path.is_file():
            raise StorageKeyError(f"artifact {key!r} is missing")
        return path.open("rb")

    def exists(self, key: str) -> bool:
        return self.resolve(key).exists()

    def walk(self, key: str) -> list[StoredFile]:
        """Regular files under a folder key, sorted; symlinks and anything resolving outside are refused."""
        base = self.resolve(key)
        if not base.is_dir():
            raise StorageKeyError(f"artifact folder {key!r} is missing")
        found: list[StoredFile] = []
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                info = path.lstat()
                if not stat.S_ISREG(info.st_mode):
                    continue  # symlinks, sockets, devices: never served
                if not path.resolve().is_relative_to(self.root):
                    continue
                relative = path.relative_to(base).as_posix()
                found.append(StoredFile(relative, info.st_size, int(info.st_mtime), path))
        return sorted(found, key=lambda f: f.relative)

    def delete(self, key: str) -> None:
        path = self.resolve(key)
        if path == self.root:
            raise StorageKeyError("refusing to delete the artifact root")
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------- tar streaming


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
    archive_digest(storage.walk(path), checkpoint_archive_name(job_id, step))."""
    return f"{job_id}-step-{step:06d}"


def checkpoint_archive(files: list[StoredFile], top: str) -> Iterator[bytes]:
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
        with item.path.open("rb") as fh:
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


def archive_digest(files: list[StoredFile], top: str) -> tuple[str, int]:
    """(sha256 hex, size) of checkpoint_archive(files, top)."""
    digest = hashlib.sha256()
    size = 0
    for chunk in checkpoint_archive(files, top):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size
