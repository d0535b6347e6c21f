"""The sandbox's processes as its parent sees them (trainer/envs/sandbox.py): the namespace's init held by
a pidfd (learnt from bwrap's --info-fd; SIGKILL to it ends the whole PID namespace), one call's CPU budget
summed over the namespace from /proc, and the kill of bwrap's process group."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class NamespaceInit:
    """The sandbox's init (the program, pid 1 of its PID namespace), held by a pidfd: SIGKILL to it makes
    the kernel kill every process of the namespace, whatever they did to their parent-death signal or
    session. Learnt from bwrap's --info-fd; `pid` None when bwrap never said (it failed to start)."""

    def __init__(self, pid: int | None, pidfd: int | None) -> None:
        self.pid, self._pidfd = pid, pidfd

    @classmethod
    def of(cls, proc: subprocess.Popen[bytes], info_fd: int, deadline: float) -> NamespaceInit:
        try:
            pid = _read_child_pid(info_fd, deadline)
        finally:
            os.close(info_fd)
        if pid is None:
            return cls(None, None)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # gone already (it exited and bwrap reaped it)
            return cls(None, None)
        # Opened while bwrap's monitor is its parent: the pidfd names the init, not a reused pid.
        if _parent_of(pid) != proc.pid:
            os.close(pidfd)
            return cls(None, None)
        return cls(pid, pidfd)

    def kill(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def close(self) -> None:
        pidfd, self._pidfd = self._pidfd, None
        if pidfd is not None:
            os.close(pidfd)


def _read_child_pid(fd: int, deadline: float) -> int | None:
    """The "child-pid" of bwrap's --info-fd JSON, or None when bwrap closed it without one."""
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        try:
            info = json.loads(data)
        except ValueError:
            continue
        pid = info.get("child-pid") if isinstance(info, dict) else None
        return pid if isinstance(pid, int) and pid > 0 else None
    return None


def _proc_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (field 3 on), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read().decode("ascii", "replace")
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _parent_of(pid: int) -> int | None:
    fields = _proc_stat(pid)
    return int(fields[1]) if fields else None


def _children(pid: int) -> list[int]:
    children: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children
    for tid in tasks:
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/task/{tid}/children") as listing:
            children.extend(int(word) for word in listing.read().split())
    return children


class CpuBudget:
    """One call's CPU budget: the CPU time of every process in the sandbox's PID namespace (the init and
    its descendants; a reaped child's time is in its parent's cutime/cstime), summed from /proc."""

    def __init__(self, init: NamespaceInit, seconds: float) -> None:
        self.init, self.seconds = init, seconds
        self.used = 0.0
        self.exceeded = False
        self._sampled_at = 0.0

    def sample(self, every: float = 0.0) -> bool:
        """Sums the namespace's CPU time (unless it did less than `every` seconds ago); True (and the
        namespace killed) once it reaches the budget."""
        if self.init.pid is None or self.exceeded or time.monotonic() - self._sampled_at < every:
            return self.exceeded
        self._sampled_at = time.monotonic()
        ticks, pending, seen = 0, [self.init.pid], set()
        while pending:
            pid = pending.pop()
            if pid in seen:
                continue
            seen.add(pid)
            fields = _proc_stat(pid)
            if fields is None:
                continue
            ticks += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
            pending.extend(_children(pid))
        self.used = max(self.used, ticks / CLOCK_TICKS)
        if self.used >= self.seconds:
            self.exceeded = True
            self.init.kill()
        return self.exceeded


def with_group(pid: int, sig: int) -> None:
    """Sends `sig` to the process group `pid` leads (the sandbox: bwrap and everything under it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
