"""Suite-wide rules.

PostgreSQL and Redis: every test reaches them through tests/services.py (the `test_postgres` and
`test_redis_url` fixtures, or its functions): the servers $STARE_TEST_POSTGRES_URL and $STARE_TEST_REDIS_URL
name, else throwaway ones the session starts itself under build/test-services/ and stops at its end.

Real components: a test that needs a real Prometheus, promtool, chromium or bubblewrap marks itself with
`requires_binary(...)`; one that runs a trainer under vLLM's interpreter with `requires_vllm_python()`
(tests needing vLLM in-process are marked `vllm`); a test that finds at run time that its real part cannot
run here (a mount without root, a private PostgreSQL or Redis server that cannot be started) calls
`skip_missing_component(...)`. Either way it is skipped with a reason starting `real component missing:`; under
STARE_REQUIRE_REAL_COMPONENTS=1 (set by `make test`, the README's test command) such a skip is a failure,
so a green run cannot hide a real part that never ran. tests/worker/test_fault_skips.py holds the fault
tests (outages, mounts, storage faults, database restarts) to it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from tests.services import PostgresServer

REAL_COMPONENT_MISSING = "real component missing:"

# Without a GPU, Triton kernels run through Triton's interpreter on CPU tensors. Triton reads the switch when a
# function is decorated, its own library's included, i.e. when triton.language is first imported; a test
# module anywhere in the tree may import it at collection (through transformers, or another test's helpers),
# so it is set here, before any test module loads. No NVIDIA device node: no GPU.
if not Path("/dev/nvidiactl").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def requires_binary(*names: str) -> pytest.MarkDecorator:
    """Skip (or, under STARE_REQUIRE_REAL_COMPONENTS=1, fail) when any of these executables is not on PATH."""
    missing = [name for name in names if shutil.which(name) is None]
    return pytest.mark.skipif(
        bool(missing),
        reason=f"{REAL_COMPONENT_MISSING} {', '.join(missing)} (scripts/install-system-deps installs it)",
    )


def skip_missing_component(reason: str) -> NoReturn:
    """Skip (or, under STARE_REQUIRE_REAL_COMPONENTS=1, fail): a real component this test needs cannot run
    here, for `reason`."""
    pytest.skip(f"{REAL_COMPONENT_MISSING} {reason}")


def path_without(folder: Path, programs: set[str]) -> str:
    """A PATH (one folder of symlinks, made in `folder`) with every program of this machine's PATH but
    `programs`: a machine that lacks them, for a test's subprocess."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or not Path(entry).is_dir():
            continue
        for program in Path(entry).iterdir():
            target = folder / program.name
            if program.name not in programs and not target.exists() and os.access(program, os.X_OK):
                target.symlink_to(program)
    return str(folder)


def vllm_python() -> str:
    """The interpreter with vLLM: $STARE_VLLM_PYTHON, or the repository's .venv-vllm (`make install`)."""
    default = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
    return os.environ.get("STARE_VLLM_PYTHON") or str(default)


@functools.cache
def _has_vllm(python: str) -> bool:
    if not Path(python).is_file():
        return False
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0


def requires_vllm_python() -> pytest.MarkDecorator:
    """Skip (or, under STARE_REQUIRE_REAL_COMPONENTS=1, fail) when vllm_python() has no vLLM."""
    python = vllm_python()
    return pytest.mark.skipif(
        not _has_vllm(python), reason=f"{REAL_COMPONENT_MISSING} vllm in {python} (make install builds it)"
    )


@pytest.fixture(scope="session")
def test_postgres() -> PostgresServer:
    """The PostgreSQL server of this test process (tests/services.py: $STARE_TEST_POSTGRES_URL, else one
    started for the session); skipped as a missing real component where neither exists."""
    from tests import services

    try:
        return services.postgres()
    except services.ServiceUnavailable as err:
        skip_missing_component(str(err))


@pytest.fixture(scope="session")
def test_redis_url() -> str:
    """The Redis of this test process (tests/services.py: $STARE_TEST_REDIS_URL, else one started for the
    session), database 0; skipped as a missing real component where neither exists."""
    from tests import services

    try:
        return services.redis_url()
    except services.ServiceUnavailable as err:
        skip_missing_component(str(err))


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's throwaway PostgreSQL and Redis (if it started any) stop with it."""
    services = sys.modules.get("tests.services")  # imported only by sessions that used a server
    if services is not None:
        services.stop_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or os.environ.get("STARE_REQUIRE_REAL_COMPONENTS") != "1":
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    if REAL_COMPONENT_MISSING in reason:
        report.outcome = "failed"
        report.longrepr = f"{reason} -- STARE_REQUIRE_REAL_COMPONENTS=1 forbids this skip"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the longest modules are handed out first (tests/machine_lock.py)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    from tests.machine_lock import scheduling_rank

    root = Path(str(config.rootpath))
    items.sort(key=lambda item: scheduling_rank(item.path.relative_to(root).as_posix()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Under pytest-xdist, a test marked `solo` runs with no other test beside it (tests/machine_lock.py);
    the lock covers its setup and teardown, module fixtures included. With STARE_TEST_TIMELINE set, each
    test's wait for the lock and its run are appended to that file (`make test`: build/test-timeline.tsv)."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:
        yield
        return
    from tests.machine_lock import hold_machine, record_timeline

    alone = item.get_closest_marker("solo") is not None
    queued = time.time()
    with hold_machine(run_id, alone=alone):
        started = time.time()
        yield
    record_timeline(item.nodeid, alone=alone, queued=queued, started=started, ended=time.time())
