"""Whether any process opened a file: an inotify watch (IN_OPEN | IN_ACCESS) on a planted file, read back
without blocking. Used to show that nothing outside reasoning-gym's package is read (issue 44, R1)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from pathlib import Path
from types import TracebackType

IN_ACCESS, IN_OPEN, IN_NONBLOCK, IN_CLOEXEC = 0x1, 0x20, 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len


class FileWatch:
    """`with FileWatch(path) as watch: ...; assert watch.events() == []`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = -1

    def __enter__(self) -> FileWatch:
        self._fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        wd = self._libc.inotify_add_watch(self._fd, str(self.path).encode(), IN_OPEN | IN_ACCESS)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {self.path}")
        return self

    def events(self) -> list[int]:
        """The masks of the events seen so far (each open or read of the file is one)."""
        masks = []
        while True:
            try:
                data = os.read(self._fd, 4096)
            except BlockingIOError:
                return masks
            offset = 0
            while offset < len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                masks.append(mask)
                offset += _EVENT.size + length

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
