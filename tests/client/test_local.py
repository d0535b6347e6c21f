"""`stare local up` starts the embedded stack (`python -m worker embedded --serve`) and leaves it running;
`stare` then finds it through <home>/embedded.json and <home>/api-key; `stare local down` stops it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stare_client.cli import Exit
from tests.client.stack import REPO_ROOT, free_port

pytestmark = pytest.mark.slow


def _stare(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stare_client.cli", *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_local_up_serves_until_down(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARE_")}
    env.update({"PYTHONPATH": str(REPO_ROOT), "STARE_HOME": str(home)})
    up = _stare("local", "up", "--port", str(free_port()), "-o", "json", env=env)
    try:
        assert up.returncode == 0, (up.stdout, up.stderr)
        info = json.loads(up.stdout)
        assert info["api"].startswith("http://127.0.0.1:") and (home / "api-key").is_file()
        assert json.loads((home / "embedded.json").read_text())["pid"] == info["pid"]
        again = _stare("local", "up", env=env)
        assert again.returncode == Exit.ERROR and "already running" in again.stderr
        # No URL or key given: the client reads the local stack's.
        me = _stare("jobs", "list", "-o", "json", env=env)
        assert me.returncode == 0 and json.loads(me.stdout) == [], (me.stdout, me.stderr)
    finally:
        down = _stare("local", "down", env=env)
    assert down.returncode == 0, (down.stdout, down.stderr)
    assert not (home / "embedded.json").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(info["pid"], 0)
    gone = _stare("jobs", "list", env=env)
    assert gone.returncode == Exit.UNREACHABLE or "no API URL" in gone.stderr, gone.stderr


# What the dev, distributed and bench extras add over the runtime install (pyproject.toml), hidden from every
# process of the stack by a sitecustomize on PYTHONPATH: every import finder answers "not installed".
NOT_IN_RUNTIME = (
    "pytest", "_pytest", "xdist", "hypothesis", "ruff", "mypy", "importlinter", "schemathesis", "grafanalib",
    "playwright", "triton", "ray", "trl", "vllm",
)  # fmt: skip
HIDE = f"""import sys
HIDDEN = {set(NOT_IN_RUNTIME)!r}
class _Hide:
    def __init__(self, finder):
        self.finder = finder
    def find_spec(self, name, path=None, target=None):
        return None if name.split(".")[0] in HIDDEN else self.finder.find_spec(name, path, target)
    def __getattr__(self, attr):
        return getattr(self.finder, attr)
sys.meta_path[:] = [_Hide(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
"""


def test_local_up_runs_a_job_on_the_runtime_install_alone(tmp_path: Path) -> None:
    """`stare local up` needs the runtime install (torch + the trainer, service and client extras; `make
    runtime`), not the full one: with the other extras hidden the stack starts and trains a job."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE)
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARE_")}
    env.update({"PYTHONPATH": f"{hide}{os.pathsep}{REPO_ROOT}", "STARE_HOME": str(home)})
    probe = f"import importlib.util as u; print([n for n in {NOT_IN_RUNTIME!r} if u.find_spec(n)])"
    found = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert found.stdout.strip() == "[]", (found.stdout, found.stderr)  # the hiding works
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        "model: {name: tiny-arith}\n"
        "task: {source: arithmetic, params: {operations: ['+'], min_operand: 0, max_operand: 50}, "
        "train_size: 16, eval_size: 4}\n"
        "optim: {steps: 2, prompts_per_step: 2}\nsampling: {group_size: 2}\ncheckpoint: {interval: 2}\n"
    )
    up = _stare("local", "up", "--port", str(free_port()), env=env)
    try:
        assert up.returncode == 0, (up.stdout, up.stderr)
        done = _stare("jobs", "submit", str(spec), "--watch", "-o", "json", env=env)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
        assert json.loads(done.stdout)["status"] == "succeeded"
    finally:
        down = _stare("local", "down", env=env)
    assert down.returncode == 0, (down.stdout, down.stderr)


def test_help_says_local_up_needs_the_runtime_install() -> None:
    env = os.environ | {"COLUMNS": "300", "PYTHONPATH": str(REPO_ROOT)}
    for args in (["--help"], ["local", "--help"]):
        shown = _stare(*args, env=env)
        assert "Needs the runtime install (`make runtime`" in shown.stdout, shown.stdout
        assert "full install" not in shown.stdout
