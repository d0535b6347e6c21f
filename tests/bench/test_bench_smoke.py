"""Benchmarks that cannot rot: every script in bench/ runs in its smoke mode (`--smoke`: the smallest sizes,
a step or two) as a subprocess, exits 0 and writes its result with the keys its figures are read from. An
API change that breaks a benchmark fails the suite. A bench that needs a real component (TRL, vLLM,
PostgreSQL, Redis) runs against it: a missing one is a real-component skip, which `make test` turns into a
failure (tests/conftest.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import requires_vllm_python, skip_missing_component, vllm_python

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


@dataclass(frozen=True)
class Smoke:
    script: str
    out_flag: str  # the option the script writes its JSON result to
    keys: tuple[str, ...]  # top-level keys of that result
    needs: tuple[str, ...] = ()  # Python packages the bench measures against
    timeout_s: int = 300
    servers: tuple[str, ...] = ()  # "postgres", "redis": the session's servers, passed by their options


SMOKES = (
    Smoke(
        "bench_big_model.py",
        "--json",
        (
            "parameters",
            "estimate_per_process",
            "placement_on_this_machine",
            "fsdp2 x2",
            "resumed at fsdp2 x1",
        ),
    ),
    Smoke("bench_control_overhead.py", "--json", ("rounds", "warmup")),
    Smoke("bench_engine.py", "--json", ("machine", "vs_trl", "stare_vs_grpo_ds", "markdown"), ("trl",)),
    Smoke("bench_event_loop.py", "--json", ("healthz_ms", "answers", "idle_healthz_ms_p99", "machine")),
    Smoke("bench_fsdp.py", "--json", ("rounds", "fsdp2_over_ddp_median", "cpu")),
    Smoke("bench_graders.py", "--json", ("machine", "throughput", "step_share")),
    Smoke("bench_gpu.py", "--out", ("machine", "matmul", "kernels", "stare_overhead", "engine", "finished")),
    Smoke("bench_kernels.py", "--json", ("machine", "settings", "correctness", "rows", "markdown")),
    Smoke("bench_memory_estimate.py", "--json", ("machine", "load_average")),
    Smoke("bench_sample_stats.py", "--json", ("torch", "results")),
    Smoke("bench_service.py", "--json", ("args", "closed", "open", "rounds"), servers=("postgres", "redis")),
    Smoke("bench_stare_overhead.py", "--json", ("machine", "settings")),
    Smoke("bench_start_memory.py", "--json", ("baseline", "ranks", "summary", "markdown", "cpu", "machine")),
    Smoke(
        "bench_streaming.py",
        "--json",
        ("standalone_median_step_s", "supervised_median_step_s", "overhead"),
        servers=("postgres",),
    ),
)


def test_every_bench_script_has_a_smoke_run_here() -> None:
    scripts = {p.name for p in BENCH.glob("bench_*.py")}
    assert scripts == {s.script for s in SMOKES} | {"bench_rollout.py"}


def _server_options(smoke: Smoke, request: pytest.FixtureRequest) -> list[str]:
    """--postgres-url / --redis-url of the session's servers (tests/services.py) for a bench that needs them."""
    options = []
    if "postgres" in smoke.servers:
        server = request.getfixturevalue("test_postgres")
        options += [
            "--postgres-url",
            f"postgresql://{server.user or ''}@{server.host}:{server.port}/{server.admin_db}",
        ]
    if "redis" in smoke.servers:
        options += ["--redis-url", request.getfixturevalue("test_redis_url")]
    return options


def _run(cmd: list[str], timeout_s: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.slow
@pytest.mark.parametrize("smoke", SMOKES, ids=lambda s: s.script.removesuffix(".py"))
def test_the_bench_smoke_run_exits_0_and_writes_its_result(
    smoke: Smoke, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    for package in smoke.needs:
        if importlib.util.find_spec(package) is None:
            skip_missing_component(f"{package} for bench/{smoke.script} (the bench extra; make install)")
    out = tmp_path / "result.json"
    cmd = [sys.executable, str(BENCH / smoke.script), "--smoke", smoke.out_flag, str(out)]
    cmd += _server_options(smoke, request)
    done = _run(cmd, smoke.timeout_s)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    missing = [key for key in smoke.keys if key not in result]
    assert missing == [], (missing, sorted(result))
    if "smoke" in result:
        assert result["smoke"] is True


@pytest.mark.slow
@requires_vllm_python()
def test_the_rollout_bench_smoke_run_compares_vllm_with_hf(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    cmd = [vllm_python(), "-m", "bench.bench_rollout", "--smoke", "--json", str(out)]
    done = _run(cmd, 600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["rollout_tokens_per_s_ratio"] > 0 and result["step_time_ratio"] > 0
    assert set(result["hf"]) == set(result["vllm"]) == {"rollout_tokens_per_s", "step_s"}
