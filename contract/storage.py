"""Storage faults: a failed write to the run's storage, named the same way by the trainer and the worker;
and the one way the project makes a write durable (fsync_file, fsync_dir, fsync_tree).

A write that fails with ENOSPC or EDQUOT (`storage_full`), EROFS (`storage_read_only`) or any other OSError
(`storage_io_error`: EIO, ...) ends the job failed, category system, with the errno name and the path in
its message, and is not retried: the next attempt would meet the same storage, and retrying would only
spend the job's attempts in seconds. Only writes are wrapped (`storage_writes`): an OSError elsewhere (a
model that will not download, a missing file) keeps its own meaning.

Standard library only: the worker imports it without torch. The `error` event it makes is
contract.protocol's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path

STORAGE_FULL = "storage_full"
STORAGE_READ_ONLY = "storage_read_only"
STORAGE_IO_ERROR = "storage_io_error"
STORAGE_CODES = frozenset({STORAGE_FULL, STORAGE_READ_ONLY, STORAGE_IO_ERROR})
_CODES = {errno.ENOSPC: STORAGE_FULL, errno.EDQUOT: STORAGE_FULL, errno.EROFS: STORAGE_READ_ONLY}
# Errnos that mean the storage itself whatever the call: the trainer's last line of defence treats them as a
# storage fault even from a write nobody wrapped.
UNAMBIGUOUS = frozenset(_CODES)
# How Rust's io::Error prints (safetensors raises SafetensorError("... (os error 28)"), not an OSError).
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def storage_code(err_no: int | None) -> str:
    return _CODES.get(err_no, STORAGE_IO_ERROR) if err_no is not None else STORAGE_IO_ERROR


def errno_name(err_no: int | None) -> str:
    if err_no is None:
        return "no errno"
    return errno.errorcode.get(err_no, f"errno {err_no}")


class StorageError(Exception):
    """A write to the run's storage failed: `code` (one of STORAGE_CODES), `errno`, `errno_name`, `path`."""

    def __init__(self, err_no: int | None, path: str | os.PathLike[str] | None, detail: str = "") -> None:
        self.errno = err_no
        self.errno_name = errno_name(err_no)
        self.path = str(path) if path is not None else None
        self.code = storage_code(err_no)
        reason = detail or (os.strerror(err_no) if err_no is not None else "write failed")
        super().__init__(f"cannot write {self.path or 'the run folder'}: {self.errno_name} ({reason})")

    def event(self, step: int | None = None) -> dict[str, object]:
        """The trainer's `error` event for it (the worker reads code, errno, path and message)."""
        return {
            "type": "error",
            "step": step,
            "code": self.code,
            "errno": self.errno_name,
            "path": self.path,
            "message": str(self),
        }


def from_exception(err: BaseException, path: str | os.PathLike[str]) -> StorageError | None:
    """The storage fault behind `err`, raised while writing under `path`, or None when it is not one.

    An OSError is one. A library's own error is one when it carries an errno (Rust's "(os error N)") or when
    the file system under `path` is now read-only or out of space (torch and others report a failed write
    without its errno).
    """
    if isinstance(err, StorageError):
        return err
    if isinstance(err, OSError):
        return StorageError(err.errno, err.filename or path, err.strerror or str(err))
    match = _RUST_OS_ERROR.search(str(err))
    if match:
        err_no = int(match.group(1))
        return StorageError(err_no, path, os.strerror(err_no))
    probed = _probe(Path(path))
    return StorageError(probed, path, f"{os.strerror(probed)}; {err}"[:300]) if probed is not None else None


def _probe(path: Path) -> int | None:
    """EROFS or ENOSPC when the file system holding `path` (or its nearest existing parent) is read-only or
    full, else None."""
    for candidate in (path, *path.parents):
        try:
            stat = os.statvfs(candidate)
        except OSError:
            continue
        if stat.f_flag & os.ST_RDONLY:
            return errno.EROFS
        if stat.f_bavail == 0:
            return errno.ENOSPC
        return None
    return None


@contextlib.contextmanager
def storage_writes(path: str | os.PathLike[str]) -> Iterator[None]:
    """Writes under `path`: a failure that is a storage fault leaves as StorageError (see from_exception);
    anything else leaves unchanged."""
    try:
        yield
    except StorageError:
        raise
    except Exception as err:
        storage = from_exception(err, path)
        if storage is None:
            raise
        raise storage from err


# ------------------------------------------------------------------------------------------- durability


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flushes a written file's bytes to the disk (before it is renamed into place)."""
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flushes a folder's entries: a rename or a new file in it survives a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike[str]) -> None:
    """Every file and every folder under `root`, `root` included (a folder written before its rename)."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fsync_file(os.path.join(dirpath, name))
        fsync_dir(dirpath)
