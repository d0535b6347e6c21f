"""Multi-node jobs on a real Ray cluster (docs/DISTRIBUTED.md): a 2-node cluster on this machine
(`ray.cluster_utils.Cluster`, two CPUs per node), jobs submitted over HTTP, real workers (Celery on Redis,
PostgreSQL) whose child is the Ray driver, training processes placed by Ray Train.

- A 2-node ddp job and a 2-node fsdp2 job (side by side on the cluster) succeed with the same per-step
  metrics as the same specs run on one node in 2 processes (torchrun). The fsdp2 job is paused on the
  way (paused, with a checkpoint whose shards both ranks wrote) and resumed: every step's metrics once.
  A third job is cancelled mid-run: cancelled, with a checkpoint at the step it stopped.
- Killing one Ray node mid-run fails the attempt (ray_worker_lost, on the lost-worker budget); with a
  replacement node the job resumes from its last checkpoint and succeeds, every step's metrics once. Two
  jobs: ddp over 2 nodes × 2 processes with HF generate, and fsdp2 over 2 nodes × 1 process with vLLM
  rollouts (each process's engine fed from the shards, within the vLLM tests' log-probability bound on
  every step, before and after the resume).
- A cluster that does not answer fails the job at once with ray_unavailable (no retry, no hang).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import requires_vllm_python, skip_missing_component, vllm_python
from tests.servers import free_port
from tests.worker.harness import (
    REPO_ROOT,
    Harness,
    Infra,
    assert_steps_exactly_once,
    harness_for,
    record_figures,
    tiny_spec,
)

# A Ray cluster, workers and several trainers: minutes, and too many processes to share the machine with
# another test (tests/machine_lock.py).
pytestmark = [pytest.mark.slow, pytest.mark.solo]

# Two jobs of one process per node side by side, or one job of two processes per node.
NODE_CPUS = 2
OBJECT_STORE = 76 * 2**20  # Ray's minimum is 75 MiB; the jobs pass nothing through it
# Figures that measure time, not training: they differ between any two runs.
TIMING_PREFIX = "perf/"
# The same world size (2), the same ranks' data, one thread per process, the same collectives over gloo
# (DDP's all-reduce; fsdp2's all-gather, which copies, and reduce-scatter): every cross-process reduction
# is a + b over two float32 values, which is commutative and so exact whichever rank adds, and the
# process-local reductions run the same kernels in the same order. The floats should be identical
# (measured: identical, for both strategies, through the fsdp2 job's pause and resume); what could still
# reorder is gloo's bucket reduction if the two launches formed different buckets, at most 1 ulp per
# reduced float32 value, carried through one AdamW update per step. 8 ulp relative bounds that with
# margin, far below the step-to-step change checked below.
REL_TOL = 8 * 2.0**-23
# for values that are 0 in one run and a rounding residue (±1e-8, e.g. advantage/mean) in the other
ABS_TOL = 1e-7


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
    # Ray's memory monitor kills workers when the *machine* is above 95 % of its memory; other test suites
    # share this one, so it would kill ours for their usage. The kernel's OOM killer still applies.
    os.environ["RAY_memory_monitor_refresh_ms"] = "0"  # noqa: SIM112 - Ray spells it so
    # A raylet holds back its first driver until it has started one worker process per CPU, and forever
    # when one of them takes over a minute to start (ray-project/ray#40131), as happened here under load.
    os.environ["RAY_prestart_worker_first_driver"] = "0"  # noqa: SIM112
    # The head asks each raylet how it is every 3 s and needs 5 failures in a row to mark its node dead;
    # every 1 s, a killed node is known dead in ~5 s (a slow raylet still has 10 s per answer).
    os.environ["RAY_health_check_period_ms"] = "1000"  # noqa: SIM112
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    started = time.monotonic()
    # This root test session's workers run their trainers, the Ray driver included, as STARE_TRAINER_UID
    # (worker/isolation.py), and a driver writes its logs into the node's session folder and connects to
    # its sockets: the cluster's files are made open to that uid, as docs/DISTRIBUTED.md asks of a cluster
    # beside a root worker (a non-root worker's trainer runs as the worker's own user).
    umask = os.umask(0)
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": NODE_CPUS,
                "include_dashboard": False,
                "object_store_memory": OBJECT_STORE,
            },
        )
        cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE)
        cluster.wait_for_nodes()
    finally:
        os.umask(umask)
    record_figures("ray_cluster", start_s=round(time.monotonic() - started, 1))
    try:
        yield cluster
    finally:
        cluster.shutdown()


def ray_worker_env(address: str, **extra: str) -> dict[str, str]:
    return {
        "STARE_RAY_ADDRESS": address,
        "STARE_RAY_NODES": "2",  # advertised in the worker registry: the API places 2-node jobs on it
        "STARE_RAY_START_TIMEOUT_S": "240",
        # A Ray job starts a dozen processes on this shared 2-core machine (load averages of 20-50 seen):
        # the suite's 4 s "worker lost" threshold would count a starved worker's late heartbeat as a loss.
        "STARE_STALE_AFTER_S": "60",
        "STARE_LEASE_S": "120",
        "OMP_NUM_THREADS": "1",  # what Ray gives a 1-CPU worker: the one-node run gets the same
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
        "RAY_TRAIN_METRICS_ENABLED": "0",  # Ray Train's own metrics: an exporter per job, read by nothing
        # Ray Train asks its workers how they are every 2 s by default: a lost node is seen sooner
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
        **extra,
    }


@pytest.fixture(scope="module")
def ray_service(
    infra: Infra, ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    """The module's API and two workers serving the cluster (two jobs run side by side)."""
    with harness_for(infra, "ray-jobs", tmp_path_factory.mktemp("ray-jobs")) as h:
        env = ray_worker_env(ray_cluster.address, STARE_VLLM_PYTHON=vllm_python())  # vllm jobs too
        workers = [h.start_worker(env=env, wait_ready=False) for _ in range(2)]
        for worker in workers:
            worker.wait_ready()
        yield h


def two_node_spec(steps: int, **distributed: Any) -> dict[str, Any]:
    return tiny_spec(steps, interval=2, distributed={"nodes": 2, "processes_per_node": 1, **distributed})


def fsdp2_spec(steps: int) -> dict[str, Any]:
    """fsdp2 runs one micro-batch per process and step: 2 prompts × 4 samples on the busier rank."""
    spec = two_node_spec(steps, strategy="fsdp2")
    spec["optim"] = {**spec["optim"], "micro_batch_size": 8}
    # the last checkpoint keeps its sharded state after success: the test reads both ranks' shards there
    spec["checkpoint"] = {**spec.get("checkpoint", {}), "training_state": "latest"}
    return spec


def one_node_run(h: Harness, job_id: str, out: Path) -> dict[int, dict[str, Any]]:
    """The job's resolved spec on one node in 2 processes under torchrun, as the worker's one-node launcher
    runs it (here directly, outside a worker, to keep the test short); its step metrics."""
    spec = h.job(job_id)["spec"]
    spec["distributed"] = {**spec["distributed"], "nodes": 1, "processes_per_node": 2}
    out.mkdir(parents=True)
    (out / "spec.yaml").write_text(yaml.safe_dump(spec))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "trainer", "run", str(out / "spec.yaml"), "--out", str(out / "run"), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in (out / "run" / "events.jsonl").read_text().splitlines()]
    return {e["step"]: e["metrics"] for e in events if e["type"] == "step"}


def assert_matches(h: Harness, job_id: str, expected: dict[int, dict[str, Any]], steps: int) -> float:
    """The job's step metrics equal the one-node run's within REL_TOL; returns the worst relative gap."""
    context = h.diagnostics(job_id)
    got = {row["step"]: row["values"] for row in h.metrics(job_id)}
    assert sorted(got) == sorted(expected) == list(range(1, steps + 1)), context
    worst = 0.0
    for step, values in expected.items():
        names = {name for name in values if not name.startswith(TIMING_PREFIX)}
        assert names == {name for name in got[step] if not name.startswith(TIMING_PREFIX)}, context
        for name in sorted(names):
            a, b = float(values[name]), float(got[step][name])
            assert math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL), (job_id, step, name, a, b)
            worst = max(worst, abs(a - b) / max(abs(a), abs(b), 1e-30) if a != b else 0.0)
    # The comparison has substance: training moved (the loss and gradient change), with many figures.
    assert len(expected[1]) > 20 and expected[1]["actor/grad_norm"] != expected[steps]["actor/grad_norm"]
    return worst


def assert_sharded_by_both_ranks(h: Harness, job_id: str, step: int) -> None:
    path = next(p for s, p, _ in h.checkpoint_rows(job_id) if s == step)
    shards = sorted(f.name for f in (h.infra.artifact_root / path / "sharded").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"], (step, shards)


def pause(h: Harness, job_id: str, steps: int) -> int:
    """Pauses the running job after its step 2; returns the step it paused at, with its checkpoint."""
    h.wait_step(job_id, 2, timeout=300)
    response = h.api("POST", f"/v1/jobs/{job_id}/pause")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "pausing"
    h.wait_status(job_id, "paused", timeout=120)
    context = h.diagnostics(job_id)
    paused_at = h.max_step(job_id)
    assert paused_at < steps, context
    assert max(c["step"] for c in h.checkpoints(job_id)) == paused_at, f"paused with a checkpoint\n{context}"
    assert_sharded_by_both_ranks(h, job_id, paused_at)
    response = h.api("POST", f"/v1/jobs/{job_id}/resume")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "queued"
    return paused_at


def assert_resumed_once(h: Harness, job_id: str, paused_at: int, steps: int) -> None:
    context = h.diagnostics(job_id)
    events = h.events(job_id)
    running = [e for e in events if e["type"] == "job.running"]
    assert [e["data"]["resume_step"] for e in running] == [None, paused_at], context
    resumed = [e for e in events if e["type"] == "trainer.resumed"]
    assert [e["data"]["step"] for e in resumed] == [paused_at], context
    row = h.job_row(job_id)
    assert (row["attempt"], row["failures"], row["lost_workers"]) == (2, 0, 0), context
    rows = h.metric_rows(job_id)
    assert_steps_exactly_once(rows, steps, context)
    assert [a for _, a, _ in rows] == [1] * paused_at + [2] * (steps - paused_at), context


def cancel(h: Harness, job_id: str, steps: int) -> int:
    """Cancels the running job after its step 2; asserts it stopped cooperatively; returns that step."""
    h.wait_step(job_id, 2, timeout=300)
    response = h.api("POST", f"/v1/jobs/{job_id}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelling"
    h.wait_status(job_id, "cancelled", timeout=120)
    context = h.diagnostics(job_id)
    rows = h.metric_rows(job_id)
    stopped_at = rows[-1][0]
    assert stopped_at < steps, f"it stopped early\n{context}"
    assert_steps_exactly_once(rows, stopped_at, context)
    checkpoints = sorted(c["step"] for c in h.checkpoints(job_id))
    assert checkpoints[-1] == stopped_at, f"a checkpoint at the step it stopped at: {checkpoints}\n{context}"
    events = [e["type"] for e in h.events(job_id)]
    assert events.count("job.cancel_requested") == 1 and events[-1] == "job.cancelled", events
    row = h.job_row(job_id)
    assert (row["attempt"], row["failures"]) == (1, 0) and h.job(job_id)["error"] is None, context
    interrupted = [e for e in h.trainer_events(job_id) if e["type"] == "interrupted"]
    assert [e["step"] for e in interrupted] == [stopped_at], "the trainer stopped cooperatively"
    return stopped_at


def test_ray_jobs_match_one_node_runs_through_pause_resume_and_cancel(
    ray_service: Harness, tmp_path: Path
) -> None:
    h, ddp_steps, fsdp2_steps, cancel_steps = ray_service, 4, 10, 20
    started = time.monotonic()
    ddp = h.post_job(two_node_spec(ddp_steps))
    fsdp2 = h.post_job(fsdp2_spec(fsdp2_steps))
    with ThreadPoolExecutor(max_workers=1) as pool:  # the one-node runs, one at a time, meanwhile
        references: dict[str, Future[dict[int, dict[str, Any]]]] = {
            job: pool.submit(one_node_run, h, job, tmp_path / job) for job in (ddp, fsdp2)
        }
        paused_at = pause(h, fsdp2, fsdp2_steps)
        h.wait_status(ddp, "succeeded", timeout=300)
        cancelled = h.post_job(two_node_spec(cancel_steps))  # in the ddp job's place on the cluster
        stopped_at = cancel(h, cancelled, cancel_steps)
        h.wait_status(fsdp2, "succeeded", timeout=300)
        expected = {job: future.result(timeout=300) for job, future in references.items()}
    took = time.monotonic() - started

    for job in (ddp, fsdp2, cancelled):  # the children were Ray drivers, one process per node
        for log in h.trainer_logs(job).values():
            assert "ray driver: 2 training processes placed, [1, 1] per node" in log, h.diagnostics(job)
    worst = {"ddp": assert_matches(h, ddp, expected[ddp], ddp_steps)}
    assert max(c["step"] for c in h.checkpoints(ddp)) == ddp_steps, h.diagnostics(ddp)
    assert_resumed_once(h, fsdp2, paused_at, fsdp2_steps)
    worst["fsdp2"] = assert_matches(h, fsdp2, expected[fsdp2], fsdp2_steps)
    assert_sharded_by_both_ranks(h, fsdp2, fsdp2_steps)
    record_figures(
        "ray_jobs",
        three_jobs_s=round(took, 1),
        worst_relative_difference=worst,
        fsdp2_paused_at=paused_at,
        cancelled_at=stopped_at,
    )


def _driver_node(h: Harness, job_id: str, attempt: int) -> str:
    log = h.trainer_logs(job_id).get(f"trainer-attempt-{attempt}.log", "")
    found = re.search(r"ray driver: connected to \S+, on node ([0-9a-f]+)", log)
    return found.group(1) if found else ""


# The jobs that lose a node: (distributed, the rest of the spec).
LOST_NODE_JOBS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # the whole cluster: 2 nodes × 2 processes, each with the whole model, sampling with HF generate
    "ddp-hf": ({"processes_per_node": 2}, {}),
    # fsdp2 over the 2 nodes, each process sampling with its own vLLM engine fed from the shards; its
    # Ray processes run vLLM's interpreter (Ray's py_executable, trainer/launch/ray_driver.py)
    "fsdp2-vllm": ({"processes_per_node": 1, "strategy": "fsdp2"}, {"rollout": {"engine": "vllm"}}),
}
LOGPROB_TOLERANCE = 1e-3  # tests/trainer/test_vllm_engine.py: vLLM's float32 CPU kernels against torch's


@requires_vllm_python()  # the fsdp2-vllm job's driver and processes run it (both jobs share the fixtures)
@pytest.mark.parametrize("job", sorted(LOST_NODE_JOBS))
def test_a_lost_ray_node_resumes_the_job_from_its_checkpoint(
    ray_cluster: Any, ray_service: Harness, job: str
) -> None:
    h, steps = ray_service, 10
    distributed, rest = LOST_NODE_JOBS[job]
    per_node = distributed["processes_per_node"]
    spec = {**two_node_spec(steps, **distributed), **rest}
    spec["optim"] = {**spec["optim"], "prompts_per_step": 4}
    job_id = h.post_job(spec)
    h.wait_step(job_id, 3, timeout=300)  # past the checkpoint of step 2
    driver_node = h.wait_for("the driver's node", lambda: _driver_node(h, job_id, 1), 30, job_id=job_id)
    others = [n for n in ray_cluster.list_all_nodes() if n.node_id != driver_node]
    victim = next((n for n in others if n is not ray_cluster.head_node), None)
    assert victim is not None, (
        f"the driver is off the head node: only the head to lose\n{h.diagnostics(job_id)}"
    )
    killed_at = time.monotonic()
    ray_cluster.remove_node(victim, allow_graceful=False)  # its raylet and its training processes, at once
    h.wait_for("the attempt to be lost", lambda: h.job_row(job_id)["attempt"] >= 2, 180, job_id=job_id)
    detected_s = time.monotonic() - killed_at
    ray_cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE)  # the replacement machine
    h.wait_status(job_id, "succeeded", timeout=300)
    context = h.diagnostics(job_id)

    logs = h.trainer_logs(job_id)
    placed = f"{2 * per_node} training processes placed, [{per_node}, {per_node}] per node"
    for attempt in (1, 2):
        assert placed in logs[f"trainer-attempt-{attempt}.log"], context
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
    world = 2 * per_node  # the world the spec asked for, in both attempts
    for step, _, m in rows:
        mine, everyone = m["memory/model_state_bytes"], m["memory/model_state_bytes_all"]
        if distributed.get("strategy") == "fsdp2":  # each process its half of the shards
            assert abs(world * mine - everyone) <= 0.01 * everyone, (step, mine, everyone)
        else:  # each process the whole model
            assert everyone == world * mine, (step, mine, everyone)
        if rest.get("rollout", {}).get("engine") == "vllm":
            # Every step sampled by vLLM holding the trainer's weights, fed from the shards: after the
            # resume too (the worst process's log-probability gap, as test_vllm_distributed bounds it).
            assert m["rollout/mismatch_abs_max"] < LOGPROB_TOLERANCE, (step, m["rollout/mismatch_abs_max"])
        else:
            assert "rollout/mismatch_abs_max" not in m, step
    record_figures(f"ray_lost_node_{job}", detected_s=round(detected_s, 1), resumed_from=resume_step)


def test_an_unreachable_cluster_fails_the_job_quickly(harness: Harness) -> None:
    h = harness
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    h.start_worker(env=ray_worker_env(address, STARE_RAY_CONNECT_TIMEOUT_S="3"))
    posted = time.monotonic()
    job_id = h.post_job(two_node_spec(4))
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
