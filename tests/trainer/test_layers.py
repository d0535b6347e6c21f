"""STYLE.md layers: the algorithm library loads no service, worker or web/queue/database framework, and the
import-linter contracts in pyproject.toml hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("fastapi", "celery", "sqlalchemy", "service", "worker")


@pytest.mark.slow
def test_importing_the_algorithm_library_loads_no_forbidden_package() -> None:
    script = "import json, sys, trainer.algos; print(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert "trainer.algos" in loaded and "torch" in loaded  # the probe really imported the library
    offending = sorted(m for m in loaded if m.split(".")[0] in FORBIDDEN)
    assert offending == []


@pytest.mark.slow
def test_import_linter_contracts_hold() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    assert lint_imports.exists(), f"import-linter is not installed next to {sys.executable}"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
