"""Artifact storage behind one interface: uploaded files, run folders and checkpoints, read and written by
the API, the worker and (through the worker) the trainer's outputs.

Keys are relative POSIX paths ("ten_x/files/file_y.jsonl", "ten_x/job_z/run/checkpoints/step-000050").
They come from database rows, never from request strings, and every key is still resolved and checked to
stay inside the root (defence in depth: a tampered row or a symlink planted in a run folder cannot reach
outside). `ArtifactStorage` is what callers use; `LocalArtifactStorage` keeps the keys in a directory (a
local disk or a mounted share). Another implementation (an object store) implements the same protocol:
`local_path` is then a local copy of a key for the one process that needs files (the trainer).

Staging: a file is written to a hidden temp file in its destination's own folder and renamed into place,
so the rename never crosses a filesystem (a tenant's folder may be a mount of its own: a rename from a
staging folder elsewhere would fail with EXDEV on every upload). A staged file that still ends up on
another filesystem is copied and fsynced there, then renamed.

What a tenant sees names its artifacts by tenant-relative paths (`shown_to_tenant`): an error raised with
the server's absolute path is logged as it is and shown without the root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol

from contract.storage import fsync_dir, fsync_file
from store.errors import NotFound

STAGED_PREFIX = ".staged-"  # a hidden file beside its destination, until commit renames it
_NAME_ENDS = r"(?![\w.-])"  # no more characters of a file name follow


class StorageKeyError(NotFound):
    """A key that is malformed, resolves outside the root, or names nothing stored. Answered as 404: there is
    nothing to serve."""

    code = "artifact_not_found"


@dataclass(frozen=True)
class StoredFile:
    key: str  # the file's own key
    relative: str  # POSIX path inside the folder that was walked
    size: int
    mtime: int


class ArtifactStorage(Protocol):
    """What the API and the worker call; keys only, so callers do not change with the storage."""

    def staged(self, key: str) -> AbstractContextManager[Path]:
        """A fresh local temp file for `key`, removed on exit unless commit() moved it into place."""
        ...

    def commit(self, staged: Path, key: str) -> None:
        """Move a staged file to `key` atomically, durably (fsynced before and after the rename)."""
        ...

    def open(self, key: str) -> BinaryIO: ...

    def exists(self, key: str) -> bool: ...

    def size(self, key: str) -> int:
        """Bytes of a file, or of every regular file under a folder."""
        ...

    def walk(self, key: str) -> list[StoredFile]:
        """Regular files under a folder key, sorted by relative path."""
        ...

    def delete(self, key: str) -> None: ...

    def local_path(self, key: str) -> Path:
        """A local path for `key`, for a process that works on files (the trainer reads its data and writes
        its run folder there)."""
        ...

    def key_of(self, path: str | os.PathLike[str]) -> str:
        """The key of a path `local_path` handed out (or one below it: a checkpoint the trainer wrote)."""
        ...

    def shown_to_tenant(self, text: str, tenant_id: str) -> str:
        """`text` (an error message, a log line) with this storage's local paths written as the tenant sees
        them: relative to its folder, or as keys for anything else under the root."""
        ...


def check_key(key: str) -> PurePosixPath:
    relative = PurePosixPath(key)
    if not key or relative.is_absolute() or ".." in relative.parts or "\\" in key or "\x00" in key:
        raise StorageKeyError(f"invalid artifact key {key!r}")
    return relative


class LocalArtifactStorage:
    """ArtifactStorage in a local (or mounted) directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        path = Path(root)
        path.mkdir(parents=True, exist_ok=True)
        self.root = path.resolve()

    def resolve(self, key: str) -> Path:
        """The absolute path of a key, refusing anything that resolves outside the root."""
        candidate = (self.root / check_key(key)).resolve()
        if not candidate.is_relative_to(self.root):
            raise StorageKeyError(f"artifact key {key!r} resolves outside the artifact root")
        return candidate

    def local_path(self, key: str) -> Path:
        return self.resolve(key)

    def key_of(self, path: str | os.PathLike[str]) -> str:
        resolved = Path(path).resolve()
        if not resolved.is_relative_to(self.root):
            raise StorageKeyError(f"{path} is not inside the artifact root")
        return resolved.relative_to(self.root).as_posix()

    @contextmanager
    def staged(self, key: str) -> Iterator[Path]:
        folder = self.resolve(key).parent
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=STAGED_PREFIX, suffix=".partial")
        os.close(fd)
        try:
            yield Path(tmp)
        finally:
            with contextlib.suppress(OSError):  # a storage fault must not hide the error that led here
                Path(tmp).unlink(missing_ok=True)

    def commit(self, staged: Path, key: str) -> None:
        target = self.resolve(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fsync_file(staged)
        os.chmod(staged, 0o644)  # mkstemp makes it 0600; the worker may read it as another user
        try:
            os.replace(staged, target)
        except OSError as err:
            if err.errno != errno.EXDEV:
                raise
            self._copy_into_place(staged, target)
        fsync_dir(target.parent)

    @staticmethod
    def _copy_into_place(staged: Path, target: Path) -> None:
        """A staged file on another filesystem: copied beside the target, fsynced, then renamed."""
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=STAGED_PREFIX, suffix=".partial")
        os.close(fd)
        try:
            shutil.copyfile(staged, tmp)
            fsync_file(tmp)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(OSError):
                Path(tmp).unlink(missing_ok=True)
        staged.unlink(missing_ok=True)

    def open(self, key: str) -> BinaryIO:
        path = self.resolve(key)
        if not path.is_file():
            raise StorageKeyError(f"artifact {key!r} is missing")
        return path.open("rb")

    def exists(self, key: str) -> bool:
        return self.resolve(key).exists()

    def size(self, key: str) -> int:
        path = self.resolve(key)
        if path.is_file():
            with contextlib.suppress(FileNotFoundError):  # removed since (a pruned checkpoint's file)
                return path.stat().st_size
            return 0
        return sum(f.size for f in self.walk(key))

    def walk(self, key: str) -> list[StoredFile]:
        """Symlinks, special files and anything resolving outside the root are skipped, never served."""
        base = self.resolve(key)
        if not base.is_dir():
            raise StorageKeyError(f"artifact folder {key!r} is missing")
        found: list[StoredFile] = []
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath) / name
                try:
                    info = path.lstat()
                    inside = path.resolve(strict=True).is_relative_to(self.root)
                except FileNotFoundError:  # removed while we walked (the worker pruning a checkpoint)
                    continue
                if not stat.S_ISREG(info.st_mode) or not inside:
                    continue
                relative = path.relative_to(base).as_posix()
                file_key = f"{key.rstrip('/')}/{relative}"
                found.append(StoredFile(file_key, relative, info.st_size, int(info.st_mtime)))
        return sorted(found, key=lambda f: f.relative)

    def delete(self, key: str) -> None:
        path = self.resolve(key)
        if path == self.root:
            raise StorageKeyError("refusing to delete the artifact root")
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def shown_to_tenant(self, text: str, tenant_id: str) -> str:
        # The tenant's own folder first (its paths become relative to it), then the rest of the root (keys).
        # A bare folder is matched only where its name ends (ten_a is not the start of ten_ab).
        folder = f"{self.root}/{tenant_id}"
        text = re.sub(re.escape(folder) + _NAME_ENDS, ".", text.replace(f"{folder}/", ""))
        text = text.replace(f"{self.root}/", "")
        return re.sub(re.escape(str(self.root)) + _NAME_ENDS, "the artifact root", text)


def open_artifact_storage(root: str | os.PathLike[str]) -> ArtifactStorage:
    """The artifact storage the API and the workers use (the one place that chooses the implementation)."""
    return LocalArtifactStorage(root)
