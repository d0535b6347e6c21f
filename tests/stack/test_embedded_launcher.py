"""The demo launcher never hangs (issue 45): `make demo` on a machine without bubblewrap, where it cannot be
installed, stops before anything starts, naming the package and the command; `python -m worker embedded`
checks the same before it starts anything; and when the worker exits after the start (on its own, with a
reason in its log, or killed mid-job), the launcher exits non-zero within 10 s with that reason, instead of
following a job that nothing can run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import path_without, requires_binary

ROOT = Path(__file__).resolve().parents[2]
TINY = {
    "model": {"name": "tiny-arith"},
    "task": {"source": "arithmetic", "train_size": 64, "eval_size": 8},
    "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
    "sampling": {"group_size": 4, "max_new_tokens": 5},
    "optim": {"steps": 500, "prompts_per_step": 3, "micro_batch_size": 6},
}
# Programs a machine without bubblewrap and without any way to install it lacks.
HIDDEN = {"bwrap", "apt-get", "apt", "sudo"}


@pytest.fixture(scope="module")
def bare_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """This machine's PATH without bubblewrap, apt-get and sudo."""
    path = path_without(tmp_path_factory.mktemp("bare") / "bin", HIDDEN)
    assert shutil.which("bwrap", path=path) is None and shutil.which("apt-get", path=path) is None
    return path


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARE_")}
    env.update({"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra})
    return env


def test_make_demo_without_bubblewrap_and_no_way_to_install_it_stops_at_once(
    tmp_path: Path, bare_path: str
) -> None:
    venv = tmp_path / "venv"  # the runtime counts as installed: its stamp is newer than pyproject.toml
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    (venv / ".stamps").mkdir()
    (venv / ".stamps" / "runtime").touch()
    home = tmp_path / "home"
    started = time.monotonic()
    done = subprocess.run(
        ["make", "--no-print-directory", "demo", f"VENV={venv}", f"STARE_HOME={home}"],
        cwd=ROOT,
        env=_env(PATH=bare_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    assert done.returncode != 0
    assert took < 10, took
    line = next(line for line in done.stderr.splitlines() if line.startswith("install-system-deps:"))
    assert "missing bubblewrap" in line and "install bubblewrap" in line, line
    assert not home.exists()  # the launcher never ran: nothing was started


def test_the_launcher_starts_nothing_without_bubblewrap(tmp_path: Path, bare_path: str) -> None:
    home = tmp_path / "home"
    demo = str(ROOT / "trainer" / "specs" / "demo.yaml")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "worker", "embedded", "--spec", demo, "--home", str(home)],
        cwd=ROOT,
        env=_env(PATH=bare_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    assert took < 10, took
    assert done.stderr.strip().count("\n") == 0, done.stderr  # one line
    assert "bubblewrap" in done.stderr and "scripts/install-system-deps bubblewrap" in done.stderr
    assert "apt-get install bubblewrap" in done.stderr
    assert not home.exists()


def _launch(tmp_path: Path, **env: str) -> tuple[subprocess.Popen[str], Path]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(TINY))
    home = tmp_path / "home"
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker", "embedded", "--spec", str(spec), "--home", str(home)],
        cwd=ROOT,
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, home


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@requires_binary("bwrap")
def test_the_launcher_stops_when_the_worker_exits_after_the_start(tmp_path: Path) -> None:
    # A worker whose advertised strategies do not validate exits at its start, its reason in worker.log.
    proc, home = _launch(tmp_path, STARE_WORKER_STRATEGIES="bogus")
    try:
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    ended = time.time()
    worker_log = home / "logs" / "worker.log"
    assert proc.returncode == 1, stderr
    # The worker wrote its traceback as it exited: the launcher followed within 10 s.
    assert ended - worker_log.stat().st_mtime < 10
    assert "stopped: the worker exited (exit code 1)" in stderr
    assert "reason: " in stderr and "ValidationError" in stderr and "strategies" in stderr
    assert f"last lines of {worker_log}" in stderr


@requires_binary("bwrap")
@pytest.mark.slow
def test_the_launcher_stops_when_the_worker_is_killed_mid_job(tmp_path: Path) -> None:
    proc, _home = _launch(tmp_path)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the job was submitted: the launcher now follows it
            if line.startswith("submitted "):
                break
        worker = next(p for p in _children(proc.pid) if " worker run" in _command_line(p))
        api = next(p for p in _children(proc.pid) if " service serve" in _command_line(p))
        os.kill(worker, signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        proc.kill()
    assert proc.returncode == 1, stderr
    assert took < 10, took
    assert "stopped: the worker exited (killed by SIGKILL)" in stderr
    assert not Path(f"/proc/{api}").exists()  # the API was stopped (and reaped) too
