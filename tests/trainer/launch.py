"""`python -m trainer run` as the worker starts it: plain for one process, under torchrun above one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_trainer(
    tmp: Path,
    name: str,
    spec: dict[str, Any],
    *,
    processes: int = 2,
    resume_from: Path | None = None,
    timeout: float = 600,
) -> Path:
    """Runs `spec` into tmp/name and returns that folder (the run must succeed). resume_from: a finished
    run's folder, copied without its step-2 checkpoint and resumed from the one before."""
    spec_path = tmp / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    out = tmp / name
    args = ["run", str(spec_path), "--out", str(out), "--no-progress"]
    if resume_from is not None:
        shutil.copytree(resume_from, out)
        shutil.rmtree(out / "checkpoints" / "step-000002")
        args.append("--resume")
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*launcher, "-m", "trainer", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out
