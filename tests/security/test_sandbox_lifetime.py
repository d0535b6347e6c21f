"""The python tool's sandbox ends every process it started and gives each call one CPU budget.

A program that clears its parent-death signal, forks, starts a new session and sleeps must not outlive its
call (nor keep its /work tmpfs, which lives as long as its mount namespace has a process); two spinning
children share one call's cpu_seconds, not one each (docs/TOOLS.md, "Limits").

A namespace's number (the inode /proc/<pid>/ns/mnt names) is given to the next namespace created once the
namespace is freed, by any process on the machine (another test's sandbox, a browser). So the test holds the
sandbox's mount namespace open from the moment bwrap names its init: the number then stays this namespace's,
and "no process is in it" means what it says.
"""

from __future__ import annotations

import glob
import os
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from contract.spec import ToolLimitsSpec
from tests.conftest import requires_binary
from trainer.envs import sandbox

LIMITS = ToolLimitsSpec(cpu_seconds=1, wall_seconds=1, memory_mb=64, processes=8, output_bytes=16384)

# Each names itself MARKER (/proc/<pid>/comm), prints its mount namespace, then leaves processes behind:
# past the wall clock, after a normal exit of the main program, or with its output closed.
_ESCAPE = """import ctypes, os, sys, time
libc = ctypes.CDLL(None)
libc.prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG 0: no signal when the parent dies
libc.prctl(15, b"MARKER", 0, 0, 0)  # PR_SET_NAME
print(os.readlink('/proc/self/ns/mnt'), flush=True)
open('/work/ballast', 'wb').write(b'x' * 2**20)
for _ in range(2):
    if os.fork() == 0:
        libc.prctl(1, 0, 0, 0, 0)
        os.setsid()
        time.sleep(600)
"""
VARIANTS = {
    "sleeps-past-the-wall-clock": _ESCAPE + "time.sleep(600)\n",
    "main-exits-children-stay": _ESCAPE + "print('main done')\n",
    "closes-its-output-and-sleeps": _ESCAPE
    + "os.close(1)\nos.close(2)\nsys.stdout = None\ntime.sleep(600)\n",
}


def _marked(marker: str) -> list[str]:
    found = []
    for comm in glob.glob("/proc/[0-9]*/comm"):
        try:
            if Path(comm).read_text().strip() == marker:
                found.append(comm)
        except OSError:
            continue
    return found


def _mount_namespaces() -> set[str]:
    spaces = set()
    for link in glob.glob("/proc/[0-9]*/ns/mnt"):
        try:
            spaces.add(os.readlink(link))
        except OSError:
            continue
    return spaces


_InitOf = Callable[["subprocess.Popen[bytes]", int, float], sandbox.NamespaceInit]


class _HeldNamespaces:
    """Opens the mount namespace of each sandbox init as bwrap names it (an nsfs descriptor: it keeps the
    namespace's number from being reused, not its processes alive)."""

    def __init__(self) -> None:
        self.inodes: list[int] = []
        self._fds: list[int] = []

    def wrap(self, of: _InitOf) -> _InitOf:
        def held_of(proc: subprocess.Popen[bytes], info_fd: int, deadline: float) -> sandbox.NamespaceInit:
            init = of(proc, info_fd, deadline)
            assert init.pid is not None, "bwrap named no init"
            fd = os.open(f"/proc/{init.pid}/ns/mnt", os.O_RDONLY)
            self._fds.append(fd)
            self.inodes.append(os.fstat(fd).st_ino)
            return init

        return held_of

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


@requires_binary("bwrap", "prlimit")
def test_fifty_escaping_programs_leave_no_process_and_no_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    marker = f"stare{uuid.uuid4().hex[:10]}"  # a process name holds 15 bytes
    tmpfs_before = Path("/proc/mounts").read_text().count("tmpfs")
    names = sorted(VARIANTS)
    held = _HeldNamespaces()
    monkeypatch.setattr(sandbox.NamespaceInit, "of", held.wrap(sandbox.NamespaceInit.of))
    try:
        _fifty_calls(marker, names, held)
    finally:
        held.close()
    assert Path("/proc/mounts").read_text().count("tmpfs") <= tmpfs_before


def _fifty_calls(marker: str, names: list[str], held: _HeldNamespaces) -> None:
    for call in range(50):
        name = names[call % len(names)]
        result = sandbox.run_python(VARIANTS[name].replace("MARKER", marker), LIMITS)
        first = result.output.split("\n")[0]
        assert first.startswith("mnt:["), (name, result)
        # The namespace held is the one the program ran in (bwrap makes no second one after naming it).
        assert first == f"mnt:[{held.inodes[call]}]", (call, name, first, held.inodes)
        if name == "main-exits-children-stay":
            assert result.exit_code == 0 and "main done" in result.output, result
        else:
            assert result.timed_out, (name, result)
        # Every call ends its own processes before it returns, not some time later, and with them its
        # mount namespace (so its /work tmpfs): no process is in it any more.
        assert _marked(marker) == [], (call, name)
        assert first not in _mount_namespaces(), (call, name)


_SPINNERS = """import os, time
for _ in range(2):
    if os.fork() == 0:
        while True:  # reports its own CPU time, then spins 20 ms more
            print(os.getpid(), time.process_time(), flush=True)
            until = time.process_time() + 0.02
            while time.process_time() < until:
                pass
time.sleep(600)
"""


@requires_binary("bwrap", "prlimit")
@pytest.mark.parametrize("budget", [1.0, 1.5])
def test_two_spinning_children_share_one_calls_cpu_budget(budget: float) -> None:
    """cpu_seconds is per call: the processes' CPU times add up to it (within the sampling's overshoot),
    where a per-process limit would let each spin its own cpu_seconds (2 x budget)."""
    limits = LIMITS.model_copy(update={"cpu_seconds": budget, "wall_seconds": 10})
    result = sandbox.run_python(_SPINNERS, limits)
    assert result.timed_out and result.exit_code is None, result
    last: dict[str, float] = {}
    for line in result.output.splitlines():
        pid, _, seconds = line.partition(" ")
        last[pid] = float(seconds)
    assert len(last) == 2, result.output[-500:]
    assert sum(last.values()) <= budget + 0.25, last
    assert budget <= result.cpu_seconds <= budget + 0.25, result
    assert result.seconds < limits.wall_seconds, result  # ended by the CPU budget, not the wall clock
