"""The python tool's sandbox ends every process it started and gives each call one CPU budget.

A program that clears its parent-death signal, forks, starts a new session and sleeps must not outlive its
call (nor keep its /work tmpfs, which lives as long as its mount namespace has a process); two spinning
children share one call's cpu_seconds, not one each (docs/TOOLS.md, "Limits").
"""

from __future__ import annotations

import glob
import os
import uuid
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


@requires_binary("bwrap", "prlimit")
def test_fifty_escaping_programs_leave_no_process_and_no_namespace() -> None:
    marker = f"stare{uuid.uuid4().hex[:10]}"  # a process name holds 15 bytes
    tmpfs_before = Path("/proc/mounts").read_text().count("tmpfs")
    names = sorted(VARIANTS)
    for call in range(50):
        name = names[call % len(names)]
        result = sandbox.run_python(VARIANTS[name].replace("MARKER", marker), LIMITS)
        first = result.output.split("\n")[0]
        assert first.startswith("mnt:["), (name, result)
        if name == "main-exits-children-stay":
            assert result.exit_code == 0 and "main done" in result.output, result
        else:
            assert result.timed_out, (name, result)
        # Every call ends its own processes before it returns, not some time later, and with them its
        # mount namespace (so its /work tmpfs): no process is in it any more.
        assert _marked(marker) == [], (call, name)
        assert first not in _mount_namespaces(), (call, name)
    assert Path("/proc/mounts").read_text().count("tmpfs") <= tmpfs_before


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
