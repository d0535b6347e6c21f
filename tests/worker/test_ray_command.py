"""Fast checks of the worker's choice of child for a job (no Ray needed): one node → the trainer, several
nodes → the Ray driver with the worker's Ray settings (a vllm job's in the vLLM interpreter, which its Ray
processes then run too), several nodes without a cluster → refused; and the
quoting of the driver's own reason out of a stderr tail that Ray's log lines follow; and the driver's end when
ray.init blocks holding the GIL (a stand-in `ray` whose init never returns)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from contract.protocol import ExitCode
from contract.spec import TrainSpec
from store.repository import Claim
from tests.worker.harness import REPO_ROOT, tiny_spec
from trainer.launch.ray_driver import CONNECT_BACKSTOP_S, job_runtime_env
from worker.launching import NoCluster, job_command
from worker.settings import WorkerSettings
from worker.training import _marked_line


def _claim(nodes: int, processes: int) -> Claim:
    spec = tiny_spec(4, distributed={"nodes": nodes, "processes_per_node": processes})
    resolved: dict[str, Any] = TrainSpec.model_validate(spec).resolved()
    return Claim("job", "tenant", "token", 1, "training", "run", resolved, 4, None)


def _settings(**values: Any) -> WorkerSettings:
    return WorkerSettings(python="/py", database_url="sqlite://", **values)


def test_a_one_node_job_runs_the_trainer_and_a_multi_node_job_the_ray_driver(tmp_path: Path) -> None:
    spec, out = tmp_path / "spec.yaml", tmp_path / "run"
    settings = _settings(ray_address="10.0.0.1:6379", ray_start_timeout_s=99.0, ray_gpus_per_worker=1.0)
    one = job_command(_claim(1, 1), settings, spec, out, resume=False)
    assert one[:3] == ["/py", "-m", "trainer"] and "--address" not in one
    multi = job_command(_claim(2, 1), settings, spec, out, resume=True)
    assert multi[:4] == ["/py", "-m", "trainer.launch.ray_driver", "run"]
    assert multi[multi.index("--address") + 1] == "10.0.0.1:6379"
    assert multi[multi.index("--start-timeout-s") + 1] == "99.0"
    assert multi[multi.index("--gpus-per-worker") + 1] == "1.0"
    assert "--resume" in multi and "--events-stdout" in multi


def test_a_vllm_job_runs_its_driver_and_its_ray_processes_in_the_vllm_interpreter(tmp_path: Path) -> None:
    spec, out = tmp_path / "spec.yaml", tmp_path / "run"
    settings = _settings(ray_address="10.0.0.1:6379", vllm_python="/vllm/python")
    vllm = _claim(2, 1)
    vllm.resolved_spec["rollout"] = {**vllm.resolved_spec["rollout"], "engine": "vllm"}
    assert job_command(vllm, settings, spec, out, resume=False)[:3] == [
        "/vllm/python",
        "-m",
        "trainer.launch.ray_driver",
    ]
    assert job_command(_claim(2, 1), settings, spec, out, resume=False)[0] == "/py"
    # The driver hands its own interpreter to the job's Ray processes for a vllm job only.
    vllm_spec = TrainSpec.model_validate(vllm.resolved_spec)
    assert job_runtime_env(vllm_spec) == {"py_executable": sys.executable}
    assert job_runtime_env(TrainSpec.model_validate(_claim(2, 1).resolved_spec)) is None


def test_a_multi_node_job_on_a_worker_without_a_cluster_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NoCluster, match=r"distributed\.nodes = 2 .*\(STARE_RAY_ADDRESS is unset\)"):
        job_command(_claim(2, 1), _settings(), tmp_path / "s.yaml", tmp_path / "run", resume=False)


def test_the_drivers_reason_is_quoted_even_with_ray_lines_after_it() -> None:
    tail = "ray driver: connected\nerror: ray_unavailable: no Ray cluster answered at X\n(global lru) num evictions: 0"
    assert _marked_line(tail, "ray_unavailable") == "no Ray cluster answered at X"
    assert _marked_line(tail, "ray_worker_lost") == ""


@pytest.mark.slow  # a driver subprocess that waits out its backstop: about 7 s
def test_a_driver_stuck_in_ray_init_holding_the_gil_still_ends(tmp_path: Path) -> None:
    """ray.init that blocks while it holds the GIL (ray-project/ray#40131) defeats the connect thread's
    timeout; the driver's GIL-free watchdog still ends it, with every thread's stack on stderr."""
    fake = tmp_path / "fake" / "ray"
    fake.mkdir(parents=True)
    # ctypes.PyDLL keeps the GIL during the call: no Python thread runs until it returns (a minute)
    (fake / "__init__.py").write_text("import ctypes\n\ndef init(**_):\n    ctypes.PyDLL(None).sleep(60)\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec(4, distributed={"nodes": 2, "processes_per_node": 1})))
    command = [
        sys.executable,
        "-m",
        "trainer.launch.ray_driver",
        "run",
        str(spec),
        "--out",
        str(tmp_path / "run"),
    ]
    command += ["--address", "127.0.0.1:1", "--connect-timeout-s", "1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), str(REPO_ROOT)])}
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    took = time.monotonic() - started
    assert done.returncode == ExitCode.FAILED, done.stderr[-2000:]
    assert took < 1 + CONNECT_BACKSTOP_S + 10, took  # not the minute the fake init blocks for
    assert "Timeout" in done.stderr and "in connect" in done.stderr, done.stderr[-2000:]
