"""Multi-node jobs on a real Ray cluster (docs/DISTRIBUTED.md): a 2-node cluster on this machine
(`ray.cluster_utils.Cluster`, one CPU per node), jobs submitted over HTTP, a real worker (Celery on Redis,
PostgreSQL) whose child is the Ray driver, training processes placed one per Ray node by Ray Train.

- A 2-node job succeeds with the same per-step metrics as the same spec run on one node in 2 processes.
- Killing the Ray node of one training process mid-run fails the attempt (ray_worker_lost, on the lost-worker
  budget); with a replacement node the job resumes from its last checkpoint and succeeds, every step's metrics
  once.
- A cluster that does not answer fails the job at once with ray_unavailable (no retry, no hang).
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import skip_missing_component
from tests.worker.harness import REPO_ROOT, Harness, assert_steps_exactly_once, record_figures, tiny_spec
from tests.worker.servers import free_port

pytestmark = pytest.mark.slow  # a Ray cluster, a worker and several trainers: minutes

NODE_CPUS = 1
OBJECT_STORE = 80 * 2**20
# Figures that measure time, not training: they differ between any two runs.
TIMING_PREFIX = "perf/"
# The same world size (2), the same ranks' data, one thread per process: every cross-process reduction is
# a + b over two float32 values, which is commutative, so the two runs compute the same floats. The one
# reordering left is gloo's: it may add a bucket's halves in another order than accelerate's DDP run did
# on its own group, a change of at most 1 ulp per reduced float32 value, carried through one AdamW update
# per step. 8 ulp (relative) covers that with margin; the measured difference is recorded.
REL_TOL = 8 * 2.0**-23
ABS_TOL = 1e-7  # values that are 0 in one run and a rounding residue (±1e-8, e.g. advantage/mean) in the other


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    try:
        from ray.cluster_utils import Cluster
    except ImportError as err:
        skip_missing_component(f"ray[train] is not installed ({err}; pip install '.[distributed]')")
    # Every Ray process started below inherits these: loopback addresses only, no usage report, no
    # preemption watcher (an extra actor process per job), and the repository importable.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = "0"
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    started = time.monotonic()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": NODE_CPUS, "include_dashboard": False, "object_store_memory": OBJECT_STORE},
    )
    cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE)
    cluster.wait_for_nodes()
    record_figures("ray_cluster", start_s=round(time.monotonic() - started, 1))
    try:
        yield cluster
    finally:
        cluster.shutdown()


def ray_worker_env(address: str, **extra: str) -> dict[str, str]:
    return {
        "STARE_RAY_ADDRESS": address,
        "STARE_RAY_START_TIMEOUT_S": "240",
        "OMP_NUM_THREADS": "1",  # what Ray gives a 1-CPU worker: the one-node run gets the same
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
        **extra,
    }


def two_node_spec(steps: int, nodes: int) -> dict[str, Any]:
    processes = 2 // nodes
    return tiny_spec(steps, interval=2, distributed={"nodes": nodes, "processes_per_node": processes})


def metrics_by_step(h: Harness, job_id: str) -> dict[int, dict[str, Any]]:
    return {row["step"]: row["values"] for row in h.metrics(job_id)}


def test_a_two_node_job_matches_the_one_node_run(ray_cluster: Any, harness: Harness) -> None:
    h = harness
    h.start_worker(env=ray_worker_env(ray_cluster.address))
    one_node = h.post_job(two_node_spec(4, nodes=1))
    h.wait_status(one_node, "succeeded", timeout=300)
    posted = time.monotonic()
    two_nodes = h.post_job(two_node_spec(4, nodes=2))
    h.wait_status(two_nodes, "succeeded", timeout=420)
    record_figures("ray_two_node_job", post_to_succeeded_s=round(time.monotonic() - posted, 1))
    context = h.diagnostics(two_nodes)

    log = "".join(h.trainer_logs(two_nodes).values())
    assert "ray driver: connected to" in log, f"the child was the Ray driver\n{context}"
    expected, got = metrics_by_step(h, one_node), metrics_by_step(h, two_nodes)
    assert sorted(got) == sorted(expected) == [1, 2, 3, 4], context
    worst = 0.0
    for step, values in expected.items():
        names = {name for name in values if not name.startswith(TIMING_PREFIX)}
        assert names == {name for name in got[step] if not name.startswith(TIMING_PREFIX)}, context
        for name in sorted(names):
            a, b = float(values[name]), float(got[step][name])
            assert math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL), (step, name, a, b)
            worst = max(worst, abs(a - b) / max(abs(a), abs(b), 1e-30) if a != b else 0.0)
    assert float(expected[4]["actor/lr"]) > 0 and len(expected[1]) > 20, "the comparison has substance"
    record_figures("ray_two_node_job", worst_relative_difference=worst)
    checkpoints = [c["step"] for c in h.checkpoints(two_nodes)]
    assert checkpoints and max(checkpoints) == 4, context


def _driver_node(h: Harness, job_id: str, attempt: int) -> str:
    log = h.trainer_logs(job_id).get(f"trainer-attempt-{attempt}.log", "")
    found = re.search(r"ray driver: connected to \S+, on node ([0-9a-f]+)", log)
    return found.group(1) if found else ""


def test_a_lost_ray_node_resumes_the_job_from_its_checkpoint(ray_cluster: Any, harness: Harness) -> None:
    h, steps = harness, 10
    h.start_worker(env=ray_worker_env(ray_cluster.address))
    job_id = h.post_job(two_node_spec(steps, nodes=2))
    h.wait_step(job_id, 3, timeout=420)  # past the checkpoint of step 2
    driver_node = h.wait_for("the driver's node", lambda: _driver_node(h, job_id, 1), 30, job_id=job_id)
    victim = next(n for n in ray_cluster.list_all_nodes() if n.node_id != driver_node)
    killed_at = time.monotonic()
    ray_cluster.remove_node(victim, allow_graceful=False)  # its raylet and its training process, at once
    h.wait_for("the attempt to be lost", lambda: h.job_row(job_id)["attempt"] >= 2, 180, job_id=job_id)
    detected_s = time.monotonic() - killed_at
    ray_cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE)  # the replacement machine
    h.wait_status(job_id, "succeeded", timeout=480)
    context = h.diagnostics(job_id)

    row = h.job_row(job_id)
    assert (row["attempt"], row["lost_workers"], row["failures"]) == (2, 1, 0), context
    events = h.events(job_id)
    recovering = [e for e in events if e["type"] == "job.recovering"]
    assert len(recovering) == 1 and recovering[0]["data"]["error"]["code"] == "ray_worker_lost", context
    assert "died" in recovering[0]["message"], recovering[0]
    resumed = [e for e in events if e["type"] == "trainer.resumed"]
    assert len(resumed) == 1 and resumed[0]["data"]["step"] >= 2, context
    rows = h.metric_rows(job_id)
    assert_steps_exactly_once(rows, steps, context)
    resume_step = resumed[0]["data"]["step"]
    assert all(attempt == (1 if step <= resume_step else 2) for step, attempt, _ in rows), rows
    record_figures("ray_lost_node", detected_s=round(detected_s, 1), resumed_from=resume_step)


def test_an_unreachable_cluster_fails_the_job_quickly(harness: Harness) -> None:
    h = harness
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    h.start_worker(env=ray_worker_env(address, STARE_RAY_CONNECT_TIMEOUT_S="10"))
    posted = time.monotonic()
    job_id = h.post_job(two_node_spec(4, nodes=2))
    h.wait_status(job_id, "failed", timeout=120)
    took = time.monotonic() - posted
    context = h.diagnostics(job_id)
    job = h.job(job_id)
    error = job["error"]
    assert (error["code"], error["category"]) == ("ray_unavailable", "system"), context
    assert address in error["message"], error
    assert (job["attempt"], job["failures"], job["lost_workers"]) == (1, 0, 0), f"not retried\n{context}"
    assert h.metric_rows(job_id) == [], context
    record_figures("ray_unreachable", post_to_failed_s=round(took, 1))
