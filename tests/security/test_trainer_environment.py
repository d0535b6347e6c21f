"""The trainer child's environment is an allow-list (worker/supervisor.py): what a worker holds for the
database, the broker or the cloud never reaches the trainer, so no tool call, log line or crash message of
the trainer can carry it. The end-to-end check with a real worker is tests/worker/test_trainer_environment.py.
"""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path

import pytest

from worker.supervisor import TRAINER_STARE_VARS, TrainerProcess, trainer_environment

CANARY = f"CANARY{uuid.uuid4().hex[:12]}"
SECRETS = {
    "STARE_DATABASE_URL": f"postgresql://stare:{CANARY}@db.internal/stare",
    "STARE_BROKER_URL": f"redis://:{CANARY}@broker.internal:6379/0",
    "STARE_API_KEY": CANARY,
    "AWS_SECRET_ACCESS_KEY": CANARY,
    "HF_TOKEN": CANARY,
    "HUGGING_FACE_HUB_TOKEN": CANARY,
    "TORCH_HUB_TOKEN": CANARY,  # a tuning family's prefix does not let a credential through
    "CUDA_CACHE_URL": f"https://u:{CANARY}@cache",
    "NCCL_SECRET": CANARY,
    "DATABASE_URL": CANARY,
    "SECRET_PREFIX_OMP_NUM_THREADS": CANARY,
}
NEEDED = {
    "OMP_NUM_THREADS": "3",
    "MKL_NUM_THREADS": "3",
    "CUDA_VISIBLE_DEVICES": "1",
    "NCCL_DEBUG": "WARN",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "HF_HUB_OFFLINE": "1",
    "HF_HOME": "/srv/hf",
    "TRANSFORMERS_OFFLINE": "1",
    "STARE_MODEL_CACHE": "/srv/models",
    "STARE_INJECT_CRASH_STEP": "7",
    "STARE_TOOL_UID": "65534",
    "LC_ALL": "C.UTF-8",
}


def test_the_environment_keeps_what_the_trainer_needs_and_nothing_secret() -> None:
    parent = {**SECRETS, **NEEDED, "PATH": "/usr/bin", "HOME": "/root", "PYTHONPATH": "/src"}
    env = trainer_environment(parent, {"PYTHONUNBUFFERED": "1"})
    assert env == {
        **NEEDED,
        "PATH": "/usr/bin",
        "HOME": "/root",
        "PYTHONPATH": "/src",
        "PYTHONUNBUFFERED": "1",
    }


def test_a_trainer_child_started_by_the_supervisor_gets_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {**SECRETS, **NEEDED}.items():
        monkeypatch.setenv(name, value)
    dump = tmp_path / "environ.json"
    script = (
        "import json, os, sys\n"
        f"raw = open('/proc/self/environ', 'rb').read().decode()\n"
        f"json.dump({{'env': dict(os.environ), 'raw': raw}}, open({str(dump)!r}, 'w'))\n"
    )
    child = TrainerProcess(
        [sys.executable, "-c", script], log_path=tmp_path / "trainer.log", env={"X_EXTRA": "1"}
    )
    assert child.wait(timeout=60) == 0, (tmp_path / "trainer.log").read_text()
    seen = json.loads(dump.read_text())
    assert CANARY not in seen["raw"] and CANARY not in json.dumps(seen["env"])
    assert not set(SECRETS) & set(seen["env"])
    assert {name: seen["env"].get(name) for name in NEEDED} == NEEDED
    assert seen["env"]["X_EXTRA"] == "1"


def test_the_stare_variables_passed_are_exactly_those_the_trainer_reads() -> None:
    """Every STARE_* name in the trainer's code is passed (a new one would otherwise silently stop
    working under the worker), and the list names nothing the trainer no longer reads."""
    root = Path(__file__).resolve().parents[2] / "trainer"
    found = set()
    for path in root.rglob("*.py"):
        found |= set(re.findall(r"[\"'](STARE_[A-Z0-9_]+)[\"']", path.read_text()))
    assert found == set(TRAINER_STARE_VARS)
