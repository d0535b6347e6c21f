"""The fault tests (outages, mounts, storage faults, database restarts) never skip silently: a skip because a
real part cannot run here (no root to mount, no private server to restart) is a missing real component
(tests/conftest.py), so STARE_REQUIRE_REAL_COMPONENTS=1 turns it into a failure. Issue 21: they used bare
pytest.skip, and `make test` passed with none of them run."""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REAL_COMPONENT_MISSING
from tests.worker import mounts
from tests.worker.mounts import Tmpfs

TESTS = Path(__file__).resolve().parents[1]
# The suites with fault tests: every skip in them must be a missing real component.
FAULT_SUITES = ("worker", "service")


def _bare_skips(path: Path) -> list[str]:
    """`pytest.skip(...)` calls and `pytest.mark.skip`/`skipif` marks in a module, as "folder/file:line"."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        called = isinstance(node, ast.Call)
        target = node.func if isinstance(node, ast.Call) else node
        if not isinstance(target, ast.Attribute) or target.attr not in {"skip", "skipif"}:
            continue
        owner = target.value
        is_mark = isinstance(owner, ast.Attribute) and owner.attr == "mark"
        if is_mark or (called and isinstance(owner, ast.Name) and owner.id == "pytest"):
            found.add(f"{path.parent.name}/{path.name}:{node.lineno}")
    return sorted(found)


def test_no_fault_suite_skips_outside_the_real_component_rule() -> None:
    modules = [p for suite in FAULT_SUITES for p in sorted((TESTS / suite).glob("*.py"))]
    assert len(modules) > 20  # the scan sees the suites
    bare = [where for module in modules for where in _bare_skips(module)]
    assert bare == [], f"skip through tests.conftest.skip_missing_component or requires_binary: {bare}"


def test_the_scan_finds_a_bare_skip(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        "import pytest\n\n@pytest.mark.skipif(True, reason='x')\ndef test_x():\n    pytest.skip('no server')\n"
    )
    assert _bare_skips(module) == [f"{tmp_path.name}/probe.py:3", f"{tmp_path.name}/probe.py:5"]


def test_a_tmpfs_without_root_is_a_missing_real_component(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception) as skipped:
        Tmpfs(tmp_path / "disk", size_mib=1)
    assert skipped.value.msg.startswith(REAL_COMPONENT_MISSING), skipped.value.msg


def test_a_refused_mount_is_a_missing_real_component(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    refused = subprocess.CompletedProcess(["mount"], 32, "", "mount: permission denied")
    monkeypatch.setattr(mounts, "_run", lambda *args: refused)
    with pytest.raises(pytest.skip.Exception) as skipped:
        Tmpfs(tmp_path / "disk", size_mib=1)
    assert skipped.value.msg.startswith(REAL_COMPONENT_MISSING), skipped.value.msg
    assert "permission denied" in skipped.value.msg
