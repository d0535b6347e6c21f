"""bench/bench_gpu.py runs where a GPU is lent only now and then, so its smoke mode runs here on every CI
pass: every section must finish without an error and report numbers, so a lent machine's minutes are
never spent on a script that broke in between."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_gpu_benchmark_smoke_run_reports_every_section(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import bench_gpu
    finally:
        sys.path.remove(str(ROOT / "bench"))
    out = tmp_path / "gpu.json"
    code = bench_gpu.main(["--quick", "--out", str(out), "--algorithms", "grpo_ds:torch,stare"])
    result = json.loads(out.read_text())
    errors = {
        name: section["error"]
        for name, section in result.items()
        if isinstance(section, dict) and "error" in section
    }
    assert code == 0 and not errors, errors
    assert result["matmul"]["tflops"] > 0
    versions = {(row["version"], row["pass"], row["dtype"]) for row in result["kernels"]["rows"]}
    for dtype in ("bfloat16", "float32"):
        for pass_ in ("forward", "forward+backward"):
            assert ("naive", pass_, dtype) in versions and ("chunked", pass_, dtype) in versions
    assert all(row["seconds"] > 0 for row in result["kernels"]["rows"])
    assert {row["loss"] for row in result["stare_overhead"]["rows"]} >= {"grpo_ds", "stare O1 (gate on)"}
    runs = result["engine"]["runs"]
    assert [(run["algorithm"], run["kernel_backend"]) for run in runs] == [
        ("grpo_ds", "torch"),
        ("stare", "auto"),
    ]
    for run in runs:
        assert len(run["steps"]) == 3
        for key in ("median_step_seconds", "median_update_seconds", "update_tflops", "mfu_vs_datasheet"):
            assert math.isfinite(run[key]) and run[key] > 0, key
        assert run["response_tokens_per_step"] == 2 * 4 * 8  # prompts × group × forced length
