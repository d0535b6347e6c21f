"""`python -m trainer.launch.ray_driver run SPEC --out DIR --address ADDR [--resume] [--events-stdout]`: a job on a Ray
cluster, nodes × processes_per_node training processes placed by Ray Train (docs/DISTRIBUTED.md).

This process is the Ray *driver*: the worker supervises it exactly as it supervises `python -m trainer run`
(the same arguments, the same event lines on stdout, the same exit codes, SIGTERM for a cooperative stop).
It connects to the cluster, starts a relay actor on its own node (trainer.launch.ray_worker), and runs
a `TorchTrainer` whose workers each run the engine for their rank, gang-scheduled in one placement group.
Ray Train retries nothing (FailureConfig max_failures 0): an attempt that loses a process fails, and the
worker's lease and attempt logic resumes the job from its last checkpoint.

Exit codes beyond the trainer's (contract.protocol.ExitCode): 69 CLUSTER_UNAVAILABLE (no connection within
--connect-timeout-s, the workers not all placed within --start-timeout-s, or the cluster stopped answering
for --health-timeout-s), 76 WORKER_LOST (a training process or its node died). The reason is the last
line on stderr.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from contract.protocol import ExitCode, format_event_line
from contract.spec import TrainSpec
from trainer.launch.command import Refused, add_run_arguments, load_job_spec

POLL_S = 0.2
LOSS_POLL_S = 0.5  # how often a failed attempt asks the cluster whether one of its nodes died
# How long past --connect-timeout-s the GIL-free watchdog in `connect` waits before it ends the driver.
CONNECT_BACKSTOP_S = 5.0
# What the training processes get of the driver's environment: the trainer's own variables and thread counts.
WORKER_ENV_PREFIXES = ("STARE_", "OMP_", "MKL_", "TOKENIZERS_", "HF_", "TRANSFORMERS_")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.launch.ray_driver", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a job spec on a Ray cluster (--out: on storage every node sees)")
    add_run_arguments(run)  # python -m trainer run's own
    run.add_argument("--address", required=True, help="the cluster: 'auto', 'HOST:PORT' or 'ray://HOST:PORT'")
    run.add_argument("--connect-timeout-s", type=float, default=30.0)
    run.add_argument("--start-timeout-s", type=float, default=120.0)
    run.add_argument("--health-timeout-s", type=float, default=30.0)
    run.add_argument("--cpus-per-worker", type=float, default=1.0)
    run.add_argument("--gpus-per-worker", type=float, default=0.0)
    return parser


def one_line(err: BaseException, limit: int = 600) -> str:
    """An exception as one line (Ray's errors run over many): the worker quotes the driver's last line."""
    return " ".join(str(err).split())[:limit]


def _fail(code: int, message: str) -> NoReturn:
    """Ends the driver at once: the cluster may be gone, so nothing waits on it (Ray ends the job's actors
    when their driver exits)."""
    sys.stdout.flush()
    print(f"error: {one_line(RuntimeError(message), 900)}", file=sys.stderr, flush=True)
    os._exit(code)


def job_runtime_env(spec: TrainSpec) -> dict[str, Any] | None:
    """The Ray runtime environment of the job's processes. A vllm job's driver runs the interpreter the
    worker keeps for vLLM (STARE_VLLM_PYTHON), and so do its training processes (Ray's `py_executable`):
    that interpreter must exist at the same path on every node, with the same Ray. Other jobs run the
    cluster's own interpreter."""
    if spec.rollout.engine == "vllm":
        return {"py_executable": sys.executable}
    return None


def connect(address: str, timeout_s: float, runtime_env: dict[str, Any] | None = None) -> None:
    """ray.init within timeout_s, or exit CLUSTER_UNAVAILABLE (ray.init itself may wait far longer).

    ray.init can also block inside Ray's core while it holds the GIL, and then the timeout below never
    runs: the first driver on a raylet waits for that raylet's prestarted workers to register, forever if
    one of them is too slow to start (ray-project/ray#40131; seen on this 2-core machine under load).
    faulthandler's watchdog is a C thread that needs no GIL: CONNECT_BACKSTOP_S after the timeout it prints
    every thread's stack and exits 1, a crash the worker retries (the next driver is not that raylet's first).
    """
    import ray

    print(f"ray driver: connecting to {address} (at most {timeout_s:g} s)", file=sys.stderr, flush=True)
    faulthandler.dump_traceback_later(timeout_s + CONNECT_BACKSTOP_S, exit=True)
    try:
        _connect(ray, address, timeout_s, runtime_env)
    finally:
        faulthandler.cancel_dump_traceback_later()


def _connect(ray: Any, address: str, timeout_s: float, runtime_env: dict[str, Any] | None) -> None:
    outcome: dict[str, BaseException | None] = {}

    def init() -> None:
        try:
            ray.init(
                address=address,
                logging_level=logging.WARNING,
                log_to_driver=True,
                configure_logging=True,
                runtime_env=runtime_env,
            )
            outcome["error"] = None
        except BaseException as err:
            outcome["error"] = err

    thread = threading.Thread(target=init, name="ray-connect", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if "error" not in outcome:
        _fail(
            ExitCode.CLUSTER_UNAVAILABLE,
            f"ray_unavailable: no Ray cluster answered at {address} within {timeout_s:g} s",
        )
    if outcome["error"] is not None:
        _fail(
            ExitCode.CLUSTER_UNAVAILABLE,
            f"ray_unavailable: cannot connect to the Ray cluster at {address}: {one_line(outcome['error'])}",
        )


def scaling(spec: TrainSpec, cpus: float, gpus: float) -> Any:
    """nodes × processes_per_node workers in one gang-scheduled placement group: one per node when
    processes_per_node is 1 (STRICT_SPREAD), else packed node by node (PACK: a node of processes_per_node
    GPUs takes exactly its share; `check_layout` refuses any other outcome)."""
    from ray.train.v2.api.config import ScalingConfig

    dist = spec.distributed
    resources = {"CPU": cpus} | ({"GPU": gpus} if gpus else {})
    strategy = "STRICT_SPREAD" if dist.processes_per_node == 1 else "PACK"
    return ScalingConfig(
        num_workers=dist.world_size,
        use_gpu=gpus > 0,
        resources_per_worker=resources,
        placement_strategy=strategy,
    )


def per_node(started: dict[int, dict[str, Any]]) -> list[int]:
    """How many of the started workers each node holds, most first."""
    counts: dict[str, int] = {}
    for info in started.values():
        counts[info["node_id"]] = counts.get(info["node_id"], 0) + 1
    return sorted(counts.values(), reverse=True)


def check_layout(spec: TrainSpec, started: dict[int, dict[str, Any]]) -> str | None:
    """Why the placed workers are not nodes × processes_per_node (None when they are)."""
    counts = per_node(started)
    dist = spec.distributed
    if len(counts) != dist.nodes or any(n != dist.processes_per_node for n in counts):
        return f"the cluster placed the workers {counts} per node, the spec asks for {dist.nodes} × {dist.processes_per_node}"
    return None


class Driver:
    """One attempt on the cluster: the TorchTrainer's fit in a thread, the relay drained here."""

    def __init__(self, args: argparse.Namespace, spec: TrainSpec) -> None:
        self.args, self.spec = args, spec
        self.stop: int | None = None
        self.fit_error: BaseException | None = None
        self.fit_done = threading.Event()
        self.storage = tempfile.mkdtemp(prefix="stare-ray-")

    def start(self) -> None:
        # Ray (the `distributed` extra) and the worker body, which imports it, load only once a job starts.
        import ray
        from ray.train.v2.api.config import FailureConfig, RunConfig
        from ray.train.v2.torch.torch_trainer import TorchTrainer
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from trainer.launch.ray_worker import Relay, train_worker

        here = ray.get_runtime_context().get_node_id()
        print(f"ray driver: connected to {self.args.address}, on node {here}", file=sys.stderr, flush=True)
        self.relay = Relay.options(  # type: ignore[attr-defined]
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)
        ).remote()
        env = {k: v for k, v in os.environ.items() if k.startswith(WORKER_ENV_PREFIXES)}
        config = {
            "spec": str(Path(self.args.spec).resolve()),
            "out": str(Path(self.args.out).resolve()),
            "resume": self.args.resume,
            "env": env,
            "relay": self.relay,
        }
        failures = FailureConfig(max_failures=0, controller_failure_limit=0, max_preemption_failures=0)
        self.trainer = TorchTrainer(
            train_worker,
            train_loop_config=config,
            scaling_config=scaling(self.spec, self.args.cpus_per_worker, self.args.gpus_per_worker),
            run_config=RunConfig(name="stare", storage_path=self.storage, failure_config=failures),
        )
        threading.Thread(target=self._fit, name="ray-fit", daemon=True).start()

    def _fit(self) -> None:
        try:
            self.trainer.fit()
        except BaseException as err:
            self.fit_error = err
        finally:
            self.fit_done.set()

    def _call(self, method: Any, *args: Any) -> Any:
        """A relay call within --health-timeout-s. The relay dead while the cluster answers (its process
        killed, by Ray's memory monitor say): exit WORKER_LOST, a retry may succeed. No answer, or anything
        else: exit CLUSTER_UNAVAILABLE."""
        import ray
        from ray.exceptions import RayActorError

        try:
            return ray.get(method.remote(*args), timeout=self.args.health_timeout_s)
        except RayActorError as err:
            _fail(ExitCode.WORKER_LOST, f"ray_worker_lost: the driver's relay actor died: {one_line(err)}")
        except Exception as err:  # timeout, the relay's node died, the cluster went away
            message = f"the Ray cluster stopped answering ({type(err).__name__}: {one_line(err)})"
            _fail(ExitCode.CLUSTER_UNAVAILABLE, f"ray_unavailable: {message}")

    def relay_events(self) -> None:
        for event in self._call(self.relay.drain):
            if self.args.events_stdout:
                sys.stdout.write(format_event_line(event) + "\n")
        sys.stdout.flush()

    def watch(self) -> int:
        """Relays events until fit ends; returns the attempt's exit code."""
        started_by = time.monotonic() + self.args.start_timeout_s
        placed = False
        forwarded = False
        while not self.fit_done.wait(POLL_S):
            self.relay_events()
            if self.stop is not None and not forwarded:
                self._call(self.relay.request_stop, self.stop)
                forwarded = True
            if not placed:
                started = self._call(self.relay.state)["started"]
                if len(started) == self.spec.distributed.world_size:
                    placed = True
                    if (why := check_layout(self.spec, started)) is not None:
                        _fail(ExitCode.CLUSTER_UNAVAILABLE, f"ray_unavailable: {why}")
                    counts = per_node(started)
                    print(
                        f"ray driver: {len(started)} training processes placed, {counts} per node",
                        file=sys.stderr,
                        flush=True,
                    )
                elif time.monotonic() > started_by:
                    _fail(ExitCode.CLUSTER_UNAVAILABLE, self._not_placed(len(started)))
        self.relay_events()
        return self.outcome()

    def _not_placed(self, started: int) -> str:
        dist = self.spec.distributed
        return (
            f"ray_unavailable: {started} of {dist.world_size} training processes started within "
            f"{self.args.start_timeout_s:g} s: the cluster has no room for {dist.nodes} node(s) × "
            f"{dist.processes_per_node} process(es) of {self.args.cpus_per_worker:g} CPU, {self.args.gpus_per_worker:g} GPU"
        )

    def outcome(self) -> int:
        state = self._call(self.relay.state)
        exits: dict[int, int] = state["exits"]
        if self.fit_error is None:
            if len(exits) < self.spec.distributed.world_size:
                print("error: Ray Train ended without every training process's exit code", file=sys.stderr)
                return ExitCode.FAILED
            codes = [exits[rank] for rank in sorted(exits)]
            return next((code for code in codes if code != ExitCode.OK), ExitCode.OK)  # rank 0's first
        if lost := settled_loss(self.fit_error, state["started"], self.args.health_timeout_s):
            print(f"error: ray_worker_lost: {lost}", file=sys.stderr, flush=True)
            return ExitCode.WORKER_LOST
        print(
            f"error: training failed on the Ray cluster: {one_line(self.fit_error, 3000)}",
            file=sys.stderr,
            flush=True,
        )
        return ExitCode.FAILED


def settled_loss(error: BaseException, started: dict[int, dict[str, Any]], timeout_s: float) -> str | None:
    """`lost_workers`, given up to timeout_s for the cluster to see a node of ours die.

    When a node dies, its peers on the surviving nodes fail at once in their next collective (gloo:
    "Connection closed by peer"), and Ray Train can end the run on those errors alone, before its health
    check or the cluster has noticed the dead node: the failure then reads as the trainer's own error. The
    cluster marks the node dead within its raylet health check (5 checks 3 s apart by default), so an
    unexplained failure waits that long before it counts as a crash; a trainer's own error pays the wait.
    """
    deadline = time.monotonic() + timeout_s
    while (lost := lost_workers(error, started)) is None and time.monotonic() < deadline:
        time.sleep(LOSS_POLL_S)
    return lost


def lost_workers(error: BaseException, started: dict[int, dict[str, Any]]) -> str | None:
    """What was lost, when the failure is a training process or a node that died (not the trainer's own
    error): a Ray actor error among the workers' failures, a preemption, or a node of ours now dead."""
    import ray
    from ray.exceptions import ActorUnavailableError, RayActorError
    from ray.train.v2._internal.exceptions import (
        WorkerHealthCheckFailedError,
        WorkerHealthCheckTimeoutError,
    )
    from ray.train.v2.api.exceptions import PreemptionError

    # A process gone (or unreachable: its node died before the cluster marked the node dead) reaches the
    # driver as Ray Train's failed health check, or as the actor error itself.
    gone = (RayActorError, ActorUnavailableError, WorkerHealthCheckFailedError, WorkerHealthCheckTimeoutError)

    if isinstance(error, PreemptionError):
        return str(error)
    failures: dict[int, BaseException] = getattr(error, "worker_failures", {}) or {}
    dead = {n["NodeID"] for n in ray.nodes() if not n.get("Alive", False)}
    lost_nodes = sorted({rank for rank, info in started.items() if info["node_id"] in dead})
    if lost_nodes:
        return f"the Ray node(s) of rank(s) {lost_nodes} died"
    died = sorted(r for r, e in failures.items() if isinstance(e, gone) or isinstance(e.__cause__, gone))
    if died:
        return f"training process(es) of rank(s) {died} died: {one_line(failures[died[0]])}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        spec = load_job_spec(args.spec)  # exit 2 on a bad spec, before touching the cluster
    except Refused as err:
        print(err, file=sys.stderr, flush=True)
        return ExitCode.USER_ERROR
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # The driver's own event log file, in the node's session folder: a root worker's driver runs as
    # STARE_TRAINER_UID, which cannot create files in a folder Ray made 0755 for another user, and Ray aborts
    # the process when it cannot (its job's events still reach the cluster's GCS).
    os.environ.setdefault("RAY_event_log_reporter_enabled", "0")
    driver: Driver | None = None
    pending: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if driver is not None:
            driver.stop = driver.stop or signum
        else:
            pending.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    connect(args.address, args.connect_timeout_s, job_runtime_env(spec))
    # ray.init installs its own C-level handler for SIGTERM (a stack dump, then an abort 3 s later: no
    # time for a cooperative stop, which must finish the step and write its checkpoint); ours replaces it.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    driver = Driver(args, spec)
    driver.stop = pending[0] if pending else None
    driver.start()
    code = driver.watch()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))  # the cluster's job ends with its driver; nothing left to wait for


if __name__ == "__main__":
    sys.exit(main())
