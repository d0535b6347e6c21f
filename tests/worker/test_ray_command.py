"""Fast checks of the worker's choice of child for a job (no Ray needed): one node → the trainer, several
nodes → the Ray driver with the worker's Ray settings, several nodes without a cluster → refused; and the
quoting of the driver's own reason out of a stderr tail that Ray's log lines follow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contract.spec import TrainSpec
from store.repository import Claim
from tests.worker.harness import tiny_spec
from worker.settings import WorkerSettings
from worker.training import NoCluster, _marked_line, job_command


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
    assert multi[:4] == ["/py", "-m", "trainer.ray_launch", "run"]
    assert multi[multi.index("--address") + 1] == "10.0.0.1:6379"
    assert multi[multi.index("--start-timeout-s") + 1] == "99.0"
    assert multi[multi.index("--gpus-per-worker") + 1] == "1.0"
    assert "--resume" in multi and "--events-stdout" in multi


def test_a_multi_node_job_on_a_worker_without_a_cluster_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NoCluster, match=r"distributed\.nodes = 2 .*\(STARE_RAY_ADDRESS is unset\)"):
        job_command(_claim(2, 1), _settings(), tmp_path / "s.yaml", tmp_path / "run", resume=False)


def test_the_drivers_reason_is_quoted_even_with_ray_lines_after_it() -> None:
    tail = "ray driver: connected\nerror: ray_unavailable: no Ray cluster answered at X\n(global lru) num evictions: 0"
    assert _marked_line(tail, "ray_unavailable") == "no Ray cluster answered at X"
    assert _marked_line(tail, "ray_worker_lost") == ""
