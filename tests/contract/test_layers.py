"""The contract is importable without torch, the trainer, the service, the worker or the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_contract_loads_only_the_standard_library_pydantic_and_yaml() -> None:
    script = (
        "import json, sys; import contract, contract.spec, contract.protocol, contract.metrics, "
        "contract.algorithms, contract.verifiers, contract.catalog, contract.storage, contract.safejson, "
        "contract.numbers; print(json.dumps(sorted(sys.modules)))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    ours = {"trainer", "service", "worker", "store", "experiments"}
    heavy = {"torch", "transformers", "accelerate", "fastapi", "starlette", "sqlalchemy", "celery"}
    assert sorted(m for m in loaded if m.split(".")[0] in ours | heavy) == []
    assert "contract.spec" in loaded
