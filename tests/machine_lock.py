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


def record_timeline(nodeid: str, *, alone: bool, queued: float, started: float, ended: float) -> None:
    """One line per test in the file STARE_TEST_TIMELINE names, if set: the xdist worker, whether the test
    was solo, when it asked for the machine, got it and ended (epoch seconds), and its id. What idles a
    core (a solo test's wait for the others to drain, the end of the run) shows in it; docs/TESTING.md."""
    path = os.environ.get("STARE_TEST_TIMELINE")
    if not path:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
    line = f"{worker}\t{int(alone)}\t{queued:.3f}\t{started:.3f}\t{ended:.3f}\t{nodeid}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write in append mode: lines of two workers do not interleave
    finally:
        os.close(fd)


# The solo modules first, then the longest others (build/test-durations.txt of 2026-12-04, setup and calls
# summed). Under xdist they are handed out in this order, provided xdist's own reorder (by number of tests
# per module, on by default) is off: `make test` passes --no-loadscope-reorder. The solo ones start before any ordinary test is
# running, so they do not wait for a long ordinary test to drain (the SmolLM2 run's setup alone is 1.5-3
# minutes, and a waiting solo test keeps its own worker idle meanwhile); the long ones follow, so the run
# does not end with one worker on a long module while the other has nothing left.
LONGEST_FIRST = (
    "tests/worker/test_ray_jobs.py",
    "tests/experiments/test_demo_recipe.py",
    "tests/experiments/test_smollm2_suite.py",
    "tests/bench/test_bench_smoke.py",
    "tests/monitoring/test_live_queries.py",
    "tests/worker/test_kills.py",
)


def scheduling_rank(module_path: str) -> int:
    """Sort key of a test's module (its path relative to the repository): the longest modules first, in
    the order above, then every other module in collection order (a stable sort keeps it)."""
    return LONGEST_FIRST.index(module_path) if module_path in LONGEST_FIRST else len(LONGEST_FIRST)
