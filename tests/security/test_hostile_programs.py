"""The python tool's sandbox against hostile programs (tests/security/programs.py), in the real bubblewrap.

Every program runs as a model's program would (trainer.envs.sandbox.run_python) while the parent's
environment holds planted secrets, and each must show its own exact refusal or result. For every one, the
same things hold on the host: no secret in the output, nothing written to the host's /tmp, /dev/shm or the
job's folder, the host's /dev/shm not grown by the sandbox's budget, and the call back within its wall clock.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.spec import ToolLimitsSpec
from tests.conftest import requires_binary
from tests.security.programs import PROGRAMS, Hostile
from trainer.envs import sandbox

LIMITS = ToolLimitsSpec(cpu_seconds=1, wall_seconds=2, memory_mb=64, processes=8, output_bytes=16384)
CANARY = f"CANARY{uuid.uuid4().hex[:12]}"
# What a worker's environment holds and a trainer's could, were it not filtered (worker/supervisor.py).
PLANTED = {
    "STARE_DATABASE_URL": f"postgresql://stare:{CANARY}@db.internal/stare",
    "STARE_BROKER_URL": f"redis://:{CANARY}@broker.internal:6379/0",
    "AWS_SECRET_ACCESS_KEY": CANARY,
    "HF_TOKEN": f"hf_{CANARY}",
}


@pytest.fixture(scope="module", autouse=True)
def planted_secrets() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in PLANTED.items():
            patch.setenv(name, value)
        sandbox.python_runtime()  # found once (ldd over the standard library), not per call
        yield


def _shm_used_bytes() -> int:
    stats = os.statvfs("/dev/shm")
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


def _host_paths(marker: str, job_dir: Path) -> list[Path]:
    return [Path("/tmp") / marker, Path("/dev/shm") / marker, job_dir / marker, Path("/") / marker]


@requires_binary("bwrap", "prlimit")
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_hostile_program_is_refused_exactly_and_leaves_the_host_as_it_was(
    name: str, tmp_path: Path
) -> None:
    case: Hostile = PROGRAMS[name]
    if case.raw and os.uname().machine != "x86_64":
        pytest.skip("uses x86_64 system-call numbers")
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    job_file = job_dir / "spec.yaml"
    job_file.write_text(f"the job's own file {CANARY}\n")
    marker = f"stare-hostile-{uuid.uuid4().hex[:12]}"
    program = (
        case.program.replace("JOB_FILE", str(job_file))
        .replace("JOB_DIR", str(job_dir))
        .replace("MARKER", marker)
    )
    before_files = sorted(job_dir.iterdir())
    shm_before = _shm_used_bytes()
    started = time.monotonic()
    result = sandbox.run_python(program, LIMITS)
    elapsed = time.monotonic() - started
    shm_grown = _shm_used_bytes() - shm_before
    described = f"{name}: exit {result.exit_code} signal {result.signal} timed out {result.timed_out}\n{result.output}"

    if case.outcome == "ok":
        assert result.exit_code == 0 and not result.timed_out, described
    elif case.outcome == "error":
        assert result.exit_code not in (0, None) and not result.timed_out, described
    elif case.outcome == "timeout":
        assert result.timed_out, described
    else:
        assert result.signal == signal.SIGSYS and not result.timed_out, described
    if case.exact:
        assert result.output.strip() == case.expect, described
    else:
        assert case.expect in result.output, described
    assert case.check is None or case.check(result.output), described

    assert CANARY not in result.output, described
    assert elapsed < LIMITS.wall_seconds + 2.0, (elapsed, described)
    # The host's /dev/shm is shared with whatever else runs here: the sandbox may not grow it by its budget.
    assert shm_grown < LIMITS.memory_mb * 2**20, (shm_grown, described)
    assert [path for path in _host_paths(marker, job_dir) if path.exists()] == [], described
    assert sorted(job_dir.iterdir()) == before_files, described
    assert job_file.read_text() == f"the job's own file {CANARY}\n"


def test_the_suite_covers_every_class_of_attack() -> None:
    """At least 40 programs, and each class of the threat model (docs/SECURITY.md) has its programs."""
    assert len(PROGRAMS) >= 40
    classes = {
        "secrets": ("reads-pid1-environ", "walks-proc-environ-and-cmdline", "lists-os-environ"),
        "files": ("writes-dev-shm", "writes-tmp", "hard-links-a-host-file", "reads-the-jobs-file"),
        "memory": ("fills-the-scratch-with-many-files", "allocates-past-rlimit-as", "fork-bomb"),
        "network": ("socket-inet", "socket-unix", "socket-netlink", "socket-packet", "socketpair"),
        "kernel": ("io-uring-setup", "ptrace-attach-pid-1", "unshare-user", "bpf", "x32-abi"),
        "time": ("cpu-loop", "sleeps-past-the-wall-clock", "floods-stdout"),
        "channels": ("flocks-a-host-file", "lockf-a-host-file", "ofd-locks-a-host-file", "inotify-init1"),
        "useful": ("does-arithmetic", "writes-and-reads-work"),
    }
    for names in classes.values():
        assert set(names) <= set(PROGRAMS), set(names) - set(PROGRAMS)
