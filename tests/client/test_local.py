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
