"""Real storage faults for the suite: a small tmpfs that can be filled, and a read-only mount over it.

Mounting needs root (CAP_SYS_ADMIN); where it is refused the tests that need it skip, saying why, as a
missing real component (tests/conftest.py: a failure under STARE_REQUIRE_REAL_COMPONENTS=1).

Read-only mid-job: `mount -o remount,ro` of the tmpfs is refused (EBUSY) while any file on it is open for
writing, and a running job always has two (the trainer's events.jsonl, the worker's copy of the trainer
log). So `read_only()` stacks a bind mount of the folder on itself and remounts that one read-only: every
path looked up from then on is on a read-only mount (EROFS for a new file, a mkdir, a rename), while the
descriptors opened before keep writing below it, as they would on a network share that turned read-only.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import skip_missing_component

MIB = 1024 * 1024


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=False)


def _mounted(path: Path) -> bool:
    return _run("mountpoint", "-q", str(path)).returncode == 0


class Tmpfs:
    """A tmpfs of `size_mib` at `path` (created if missing); unmount() removes every mount stacked there."""

    def __init__(self, path: Path, size_mib: int) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            skip_missing_component("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
        done = _run("mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path))
        if done.returncode != 0:
            skip_missing_component(f"cannot mount a tmpfs here ({done.stderr.strip()})")
        self.read_only_bind = False

    def free_bytes(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def fill(self, leave_bytes: int) -> int:
        """Writes a filler file until only about `leave_bytes` are free; returns the bytes written."""
        target = max(0, self.free_bytes() - leave_bytes)
        chunk = b"\0" * MIB
        written = 0
        with (self.path / "filler.bin").open("wb") as fh:
            while written < target:
                part = chunk[: min(MIB, target - written)]
                fh.write(part)
                written += len(part)
        return written

    def clear_filler(self) -> None:
        (self.path / "filler.bin").unlink(missing_ok=True)

    def read_only(self) -> None:
        """From now on every path under the folder is on a read-only mount (see the module docstring)."""
        for args in (
            ("mount", "--bind", str(self.path), str(self.path)),
            ("mount", "-o", "remount,bind,ro", str(self.path)),
        ):
            done = _run(*args)
            assert done.returncode == 0, f"{' '.join(args)}: {done.stderr}"
        self.read_only_bind = True

    def writable_again(self) -> None:
        """Removes the read-only bind: the tmpfs below is writable as before."""
        assert self.read_only_bind
        done = _run("umount", str(self.path))
        assert done.returncode == 0, f"umount of the read-only bind: {done.stderr}"
        self.read_only_bind = False

    def unmount(self) -> None:
        """Teardown: every mount at the path, lazily where a process still holds a file on it."""
        for _ in range(4):
            if not _mounted(self.path):
                return
            if _run("umount", str(self.path)).returncode != 0:
                _run("umount", "-l", str(self.path))
        assert not _mounted(self.path), f"{self.path} is still mounted"
