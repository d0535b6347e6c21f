"""Receiving and unpacking a checkpoint archive without trusting it: the client's limits, the capped sink the
download streams into, and the capped, streaming extraction.

A hostile or broken server controls every byte of the download, its SHA-256 header and the listing's sizes,
so a matching digest proves nothing about safety. What is enforced instead, while the bytes flow (never
after the fact):

- the download: at most `Content-Length` bytes when announced, and never more than the client's own cap
  (`ArchiveLimits.max_archive_bytes`); the stream is cut at the first byte over.
- the unpacked tree: at most the checkpoint's announced size (its `bytes`, the sum of its files), never more
  than `ArchiveLimits.max_unpacked_bytes`, and at most `max_ratio` times the archive's size on disk (a
  compression bomb). A member's size is its logical size, so a sparse member counts in full (it is
  written out as the zeros it stands for). A member announcing more than what is left is refused before a
  byte of it is written; the bytes written are counted as they go.
- the decompressed stream (headers included) is capped by the same ratio, and no single header (pax or GNU
  long name) may announce more than `max_header_bytes`, so tarfile never reads a huge header into memory.
- the shape: at most `max_members` members, paths at most `max_path_depth` deep and `max_path_chars` long,
  each name at most 255 bytes; one top folder; every member a regular file or a folder, none twice, none
  under a file; no links, devices, FIFOs, absolute paths or `..`; a truncated or corrupt archive is refused.

Every refusal is an UnsafeArchive (ArchiveTooLarge for the size rules) and removes what the extraction
wrote, so the caller's staging folder is all that is left to delete. gzip, bzip2 and xz are decompressed
here (the server sends a plain tar; a compressed one is accepted within the ratio).
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
import os
import shutil
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any, Literal, cast

from stare_client import errors
from stare_client.transport import ProgressCallback

GIB = 1024**3
CHUNK_BYTES = 1024 * 1024
NAME_MAX_BYTES = 255  # one path component, as POSIX filesystems allow
HEADER_BYTES_PER_MEMBER = 3 * tarfile.BLOCKSIZE  # a pax header, its data and the member's own header
STREAM_SLACK_BYTES = 1024 * 1024  # tar padding and headers: a tiny honest archive must not hit the ratio


@dataclass(frozen=True)
class ArchiveLimits:
    """The client's own bounds on a checkpoint download, whatever the server announces
    (`Client(archive_limits=...)`). The defaults admit a checkpoint of a model of a few tens of billions of
    parameters with its optimiser state."""

    max_unpacked_bytes: int = 1024 * GIB
    max_ratio: float = 10.0  # unpacked bytes / archive bytes; the server's plain tar is about 1
    max_members: int = 100_000
    max_path_depth: int = 32
    max_path_chars: int = 1024
    max_header_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_unpacked_bytes", "max_members", "max_path_depth", "max_path_chars"):
            if getattr(self, name) < 1:
                raise errors.ConfigError(f"ArchiveLimits.{name} must be at least 1", param=name)
        if self.max_ratio < 1:
            raise errors.ConfigError("ArchiveLimits.max_ratio must be at least 1", param="max_ratio")

    @property
    def max_archive_bytes(self) -> int:
        """The most a download may send: the unpacked cap plus the tar's headers for every member."""
        return self.max_unpacked_bytes + self.max_members * HEADER_BYTES_PER_MEMBER


DEFAULT_LIMITS = ArchiveLimits()


def too_large(message: str, code: str) -> errors.ArchiveTooLarge:
    return errors.ArchiveTooLarge(message, code=code)


# ------------------------------------------------------------------------------------------------ download


class ArchiveSink:
    """Where a download's bytes go: a file, a SHA-256 and a count that refuses the first byte over the cap
    (the announced Content-Length, bounded by the limits). Sync and async downloads both feed it."""

    def __init__(
        self,
        path: Path,
        announced_bytes: int | None,
        limits: ArchiveLimits,
        progress: ProgressCallback | None = None,
    ) -> None:
        if announced_bytes is not None and announced_bytes > limits.max_archive_bytes:
            raise too_large(
                f"the server announces a {announced_bytes}-byte archive, over this client's limit of "
                f"{limits.max_archive_bytes} bytes (ArchiveLimits.max_unpacked_bytes)",
                "archive_too_large",
            )
        self.path = path
        self.announced_bytes = announced_bytes
        self.cap_bytes = announced_bytes if announced_bytes is not None else limits.max_archive_bytes
        self.progress = progress
        self.done_bytes = 0
        self.digest = hashlib.sha256()
        self.out: IO[bytes] = path.open("wb")

    def write(self, chunk: bytes) -> None:
        if self.done_bytes + len(chunk) > self.cap_bytes:
            self.close()
            self.path.unlink(missing_ok=True)
            raise too_large(
                f"the download sent more than its {self.cap_bytes} bytes "
                f"({'Content-Length' if self.announced_bytes is not None else 'this client limit'})",
                "archive_too_large",
            )
        self.out.write(chunk)
        self.digest.update(chunk)
        self.done_bytes += len(chunk)
        if self.progress is not None:
            self.progress(self.done_bytes, self.announced_bytes or 0)

    def finish(self) -> str:
        """Flush to disk; the SHA-256 of what was received."""
        self.out.flush()
        os.fsync(self.out.fileno())
        self.close()
        return self.digest.hexdigest()

    def close(self) -> None:
        if not self.out.closed:
            self.out.close()


# ----------------------------------------------------------------------------------------------- unpacking


@dataclass
class Budget:
    """What an extraction may still write and read: unpacked bytes (announced size, client cap, ratio) and
    decompressed stream bytes (ratio)."""

    limits: ArchiveLimits
    unpacked_cap_bytes: int
    stream_cap_bytes: int
    written_bytes: int = 0

    @classmethod
    def of(cls, limits: ArchiveLimits, archive_bytes: int, announced_bytes: int | None) -> Budget:
        by_ratio = int(limits.max_ratio * archive_bytes)
        caps = [limits.max_unpacked_bytes, by_ratio + STREAM_SLACK_BYTES]
        if announced_bytes is not None:
            caps.append(max(announced_bytes, 0))
        return cls(limits, min(caps), by_ratio + STREAM_SLACK_BYTES)

    def take(self, name: str, size_bytes: int) -> None:
        """Reserve a member's logical size before writing it."""
        if size_bytes < 0:
            raise _unsafe(name, f"announces a negative size ({size_bytes} bytes)")
        if self.written_bytes + size_bytes > self.unpacked_cap_bytes:
            raise too_large(
                f"archive member {name!r} ({size_bytes} bytes) would unpack past the cap of "
                f"{self.unpacked_cap_bytes} bytes (the announced size, this client's limit, or "
                f"{self.limits.max_ratio:g} times the archive)",
                "unpacked_too_large",
            )
        self.written_bytes += size_bytes


class CappedStream(io.RawIOBase):
    """The decompressed archive as tarfile reads it: refuses reads past the stream cap, any single read larger
    than a chunk or a header may be (a pax or long-name header announcing gigabytes), and seeks past it."""

    def __init__(self, inner: IO[bytes], budget: Budget) -> None:
        self.inner = inner
        self.budget = budget
        self.max_read_bytes = max(budget.limits.max_header_bytes, CHUNK_BYTES)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.inner.tell()

    def _check_reach(self, end: int) -> None:
        if end > self.budget.stream_cap_bytes:
            raise too_large(
                f"the archive decompresses past {self.budget.stream_cap_bytes} bytes "
                f"({self.budget.limits.max_ratio:g} times its size): a compression bomb",
                "archive_ratio",
            )

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > self.max_read_bytes:
            raise errors.UnsafeArchive(
                f"an archive header announces {size} bytes of metadata (at most "
                f"{self.budget.limits.max_header_bytes})",
                code="unsafe_archive",
            )
        self._check_reach(self.inner.tell() + size)
        return self.inner.read(size)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = offset if whence == io.SEEK_SET else self.inner.tell() + offset
        if whence not in (io.SEEK_SET, io.SEEK_CUR):
            raise errors.UnsafeArchive("tar reading sought from the end", code="unsafe_archive")
        self._check_reach(target)
        return self.inner.seek(target)


def _decompressed(fh: IO[bytes]) -> IO[bytes]:
    """The archive's tar bytes: gzip, bzip2 and xz by their magic numbers, else the file itself."""
    magic = fh.read(6)
    fh.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        return cast(IO[bytes], gzip.GzipFile(fileobj=fh, mode="rb"))
    if magic.startswith(b"BZh"):
        return cast(IO[bytes], bz2.BZ2File(fh, mode="rb"))
    if magic.startswith(b"\xfd7zXZ\x00"):
        return cast(IO[bytes], lzma.LZMAFile(fh, mode="rb"))
    return fh


def _unsafe(name: str, why: str) -> errors.UnsafeArchive:
    return errors.UnsafeArchive(f"archive member {name!r} {why}", code="unsafe_archive")


def member_path(member: tarfile.TarInfo, limits: ArchiveLimits = DEFAULT_LIMITS) -> PurePosixPath:
    """The member's safe relative path, or UnsafeArchive: a regular file or folder, relative, inside its
    folder, within the depth and length limits."""
    name = member.name
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise _unsafe(name, "has an absolute path")
    path = PurePosixPath(name.replace("\\", "/"))
    if any(part == ".." for part in path.parts):
        raise _unsafe(name, "leaves its folder (..)")
    if member.issym() or member.islnk():
        raise _unsafe(name, f"is a {'symbolic' if member.issym() else 'hard'} link")
    if not (member.isfile() or member.isdir()):
        raise _unsafe(name, "is not a regular file or folder (a device, FIFO or other special file)")
    parts = [p for p in path.parts if p not in ("", ".")]
    if not parts:
        raise _unsafe(name, "has an empty name")
    if len(name) > limits.max_path_chars or len(parts) > limits.max_path_depth:
        raise _unsafe(
            name[:80] + "...",
            f"has a path of {len(name)} characters and depth {len(parts)} (at most "
            f"{limits.max_path_chars} and {limits.max_path_depth})",
        )
    if any(len(p.encode("utf-8", "surrogateescape")) > NAME_MAX_BYTES for p in parts):
        raise _unsafe(name[:80] + "...", f"has a name longer than {NAME_MAX_BYTES} bytes")
    return PurePosixPath(*parts)


@dataclass
class Tree:
    """The members accepted so far: one top folder, no path twice, nothing under a file. A folder that a
    member's path implies (the server's tar lists files only) may still come as a member of its own, once."""

    limits: ArchiveLimits
    top: str | None = None
    members: int = 0
    kinds: dict[PurePosixPath, Literal["file", "dir", "implied"]] = field(default_factory=dict)

    def admit(self, member: tarfile.TarInfo) -> PurePosixPath:
        rel = member_path(member, self.limits)
        self.members += 1
        if self.members > self.limits.max_members:
            raise errors.UnsafeArchive(
                f"the archive has more than {self.limits.max_members} members", code="too_many_members"
            )
        if self.top is None:
            if len(rel.parts) != 1 or not member.isdir():
                raise _unsafe(member.name, "comes first but is not the checkpoint's top folder")
            self.top = rel.parts[0]
        elif rel.parts[0] != self.top:
            raise errors.UnsafeArchive(
                f"a checkpoint archive holds one top-level folder; {member.name!r} is outside {self.top!r}",
                code="unsafe_archive",
            )
        known = self.kinds.get(rel)
        if known is not None and not (known == "implied" and member.isdir()):
            raise _unsafe(member.name, "appears twice (a second copy would overwrite the first)")
        for parent in rel.parents:
            if not parent.parts:
                continue
            if self.kinds.get(parent) == "file":
                raise _unsafe(member.name, f"lies under {str(parent)!r}, which is a file")
            self.kinds.setdefault(parent, "implied")
        self.kinds[rel] = "dir" if member.isdir() else "file"
        return rel


def _folder(into: Path, rel: PurePosixPath) -> Path:
    """Make `into/rel` level by level, never `into` or above: if `into` vanished (a cancelled download's
    cleanup), this fails instead of making it again."""
    path = into
    for part in rel.parts:
        path = path / part
        path.mkdir(mode=0o755, exist_ok=True)
    return path


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path, budget: Budget) -> None:
    budget.take(member.name, member.size)
    source = tar.extractfile(member)
    if source is None:
        raise _unsafe(member.name, "cannot be read")
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    written = 0
    with source, os.fdopen(fd, "wb") as out:
        while chunk := source.read(CHUNK_BYTES):
            written += len(chunk)
            if written > member.size:  # tarfile never does this; the count is the rule, not its trust
                raise _unsafe(member.name, f"holds more than its announced {member.size} bytes")
            out.write(chunk)
    if written != member.size:
        raise _unsafe(member.name, f"ends after {written} of {member.size} bytes (a truncated archive)")


def safe_extract(
    archive: Path,
    into: Path,
    *,
    limits: ArchiveLimits = DEFAULT_LIMITS,
    announced_bytes: int | None = None,
) -> Path:
    """Unpack `archive` under `into`, member by member, within the limits (the module docstring); files are
    written 0644 and folders 0755 whatever the archive says, never through a link. Returns the top folder;
    on any refusal removes what it wrote and raises UnsafeArchive."""
    budget = Budget.of(limits, archive.stat().st_size, announced_bytes)
    tree = Tree(limits)
    made_into = not into.exists()
    into.mkdir(mode=0o755, exist_ok=True)
    try:
        with archive.open("rb") as raw, _decompressed(raw) as plain:
            stream = CappedStream(plain, budget)
            with tarfile.open(fileobj=cast(IO[bytes], stream), mode="r:") as tar:
                while (member := tar.next()) is not None:
                    rel = tree.admit(member)
                    if member.isdir():
                        _folder(into, rel)
                    else:
                        _write_member(tar, member, _folder(into, rel.parent) / rel.name, budget)
                    del cast(Any, tar).members[:]  # tarfile keeps every TarInfo; the Tree has what it needs
    except BaseException as err:
        if made_into:
            shutil.rmtree(into, ignore_errors=True)
        elif tree.top is not None:
            shutil.rmtree(into / tree.top, ignore_errors=True)
        if isinstance(err, errors.StareError):
            raise
        if isinstance(err, tarfile.TarError | EOFError | OSError | zlib.error | lzma.LZMAError | ValueError):
            raise errors.UnsafeArchive(
                f"the archive is truncated or corrupt: {err or type(err).__name__}", code="bad_archive"
            ) from err
        raise
    if tree.top is None:
        raise errors.UnsafeArchive("the archive is empty", code="bad_archive")
    return into / tree.top
