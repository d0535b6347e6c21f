"""examples/compare_grpo_ds_stare.py runs against the real service: both jobs succeed, both final
checkpoints load with transformers, and the side-by-side summary is printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stare_client import Client
from tests.client.stack import REPO_ROOT, Stack, tiny_spec

pytestmark = pytest.mark.slow


def test_compare_example_runs(stack: Stack, tmp_path: Path) -> None:
    spec = tiny_spec(2)
    spec["evaluation"] = {"interval": 0}
    spec["task"] = {**spec["task"], "eval_size": 4}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARE_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "examples" / "compare_grpo_ds_stare.py"),
            "--spec",
            str(tmp_path / "tiny.yaml"),
            "--url",
            stack.url,
            "--api-key",
            stack.api_key,
            "--out",
            str(tmp_path / "out"),
            "--timeout",
            "300",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, (result.stdout, result.stderr, stack.diagnostics())
    out = result.stdout
    for arm in ("grpo_ds", "stare"):
        assert f"{arm}: step 2 loaded from {tmp_path / 'out' / arm / 'model'}" in out, out
        assert (tmp_path / "out" / arm / "model" / "model.safetensors").is_file()
    header = next(
        line for line in out.splitlines() if "grpo_ds" in line and "stare" in line and "step" not in line
    )
    assert header.split() == ["grpo_ds", "stare"]
    table = {
        line.split("  ")[0].strip(): line.split()[-2:]
        for line in out.splitlines()
        if line.startswith(("status", "avg@k after"))
    }
    assert table["status"] == ["succeeded", "succeeded"]
    with Client(stack.url, stack.api_key) as client:
        arms = {j.metadata.get("arm"): j for j in client.jobs.list() if j.metadata.get("example")}
        assert {arms["grpo_ds"].algorithm, arms["stare"].algorithm} == {"grpo_ds", "stare"}
        after = client.reports.get(arms["stare"]).evaluation.after
        assert after is not None and table["avg@k after"][1] == f"{after.avg_at_k:.3f}"
