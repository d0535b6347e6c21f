"""Issue 44, R5: the python tool's process cap is per call, whatever runs beside it.

Before, the cap was RLIMIT_NPROC = processes + 1 + the tasks the sandbox's user owned when the call
started, counted over every sandbox of that user: a `processes=2` call forked 10 while others exited, and
a call started first got EAGAIN on its first fork once another had forked. Now prlimit, as pid 1 in the
call's own user namespace, sets the cap there, where only the call's own tasks count.
"""

from __future__ import annotations

import threading
import time

from contract.spec import ToolLimitsSpec
from tests.conftest import requires_binary
from trainer.envs import sandbox

# Forks until the kernel refuses (each child sleeps), after `delay` seconds; prints how many it made.
_COUNTER = """import os, time
time.sleep({delay})
made = 0
while made < 200:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep({hold})
        os._exit(0)
    made += 1
print(made, flush=True)
time.sleep({hold})
"""


def _limits(processes: int, wall: float = 10.0) -> ToolLimitsSpec:
    return ToolLimitsSpec(
        cpu_seconds=5, wall_seconds=wall, memory_mb=64, processes=processes, output_bytes=4096
    )


def _forks(result: sandbox.SandboxResult) -> int:
    return int(result.output.split()[0])


@requires_binary("bwrap", "prlimit")
def test_a_call_forks_exactly_its_cap_whatever_runs_beside_it() -> None:
    results: dict[str, sandbox.SandboxResult] = {}

    def run(name: str, code: str, processes: int) -> None:
        results[name] = sandbox.run_python(code, _limits(processes))

    # `first` starts first and forks last; `hog` forks its whole cap meanwhile and holds it.
    first = threading.Thread(target=run, args=("first", _COUNTER.format(delay=2.0, hold=1.0), 4))
    hog = threading.Thread(target=run, args=("hog", _COUNTER.format(delay=0.0, hold=4.0), 16))
    first.start()
    time.sleep(0.3)
    hog.start()
    time.sleep(1.0)  # the hog holds its 15 children now
    small = sandbox.run_python(_COUNTER.format(delay=0.0, hold=0.5), _limits(2))
    first.join(30)
    hog.join(30)
    assert _forks(results["hog"]) == 15, results["hog"].output  # its cap, less itself
    assert _forks(results["first"]) == 3, results["first"].output  # not 0: the hog's tasks are not its own
    assert _forks(small) == 1, small.output  # not 10: its cap is 2, whoever exits meanwhile


@requires_binary("bwrap", "prlimit")
def test_threads_count_against_the_cap_too() -> None:
    code = """import threading, time
made = 0
try:
    while made < 100:
        threading.Thread(target=time.sleep, args=(1,), daemon=True).start()
        made += 1
except RuntimeError:
    pass
print(made)
"""
    result = sandbox.run_python(code, _limits(5))
    assert result.output.split()[0] == "4", result.output
