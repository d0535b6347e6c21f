"""One machine shared by pytest-xdist's workers: most tests run two at a time, a `solo` test runs alone.

`make test` runs the suite on two xdist workers. Most tests spend their time waiting (on HTTP, a worker's
poll, a subprocess's start), so two at a time use the second core. A few would not gain and would lose: a
trainer with two intra-op threads beside any other busy process is slowed several times over, because
libgomp's threads spin at each barrier while the one they wait for is descheduled (docs/TESTING.md), and a
Ray cluster's many processes starve the other worker's timed waits. Those modules carry `pytest.mark.solo`.

The rule is a readers-writer lock on two files (fcntl.flock, so a killed worker's locks go with it):
an ordinary test holds the machine shared, a solo test holds it exclusively. A solo test that waits takes
the turnstile first, so ordinary tests queued behind it wait too, and it cannot be starved by a stream of
short ones. Outside xdist (one process) nothing is locked.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def lock_paths(run_id: str) -> tuple[Path, Path]:
    """The turnstile and the machine lock of one xdist run (every worker of the run shares its id)."""
    base = Path(tempfile.gettempdir()) / f"stare-tests-{run_id}"
    return base.with_suffix(".turnstile"), base.with_suffix(".machine")


@contextmanager
def _flock(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases its lock


@contextmanager
def hold_machine(run_id: str, *, alone: bool) -> Iterator[None]:
    """Hold the machine for one test: exclusively when `alone`, else shared with other ordinary tests."""
    turnstile, machine = lock_paths(run_id)
    if alone:
        with _flock(turnstile, fcntl.LOCK_EX), _flock(machine, fcntl.LOCK_EX):
            yield
        return
    with _flock(turnstile, fcntl.LOCK_EX):
        fd = os.open(machine, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        yield
    finally:
        os.close(fd)


# The modules that take longest (build/test-durations.txt of 2026-12-04 on a 2-core AMD EPYC, setup and calls
# summed: 248, 210, 199, 99, 87 and 87 s). Under xdist they are handed out first, so the run does not end
# with one worker on a long module while the other has nothing left (the solo ones hold both workers
# whenever they run, so they too are better at the start than at the end).
LONGEST_FIRST = (
    "tests/experiments/test_smollm2_suite.py",
    "tests/bench/test_bench_smoke.py",
    "tests/worker/test_ray_jobs.py",
    "tests/experiments/test_demo_recipe.py",
    "tests/monitoring/test_live_queries.py",
    "tests/worker/test_kills.py",
)


def scheduling_rank(module_path: str) -> int:
    """Sort key of a test's module (its path relative to the repository): the longest modules first, in
    the order above, then every other module in collection order (a stable sort keeps it)."""
    return LONGEST_FIRST.index(module_path) if module_path in LONGEST_FIRST else len(LONGEST_FIRST)
