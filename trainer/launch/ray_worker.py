"""What runs inside the Ray cluster for a multi-node job: the relay actor and each training worker's body.

`Relay` is one small actor, pinned to the driver's node (so a lost worker node never takes it along), that
carries what the driver and the training processes tell each other:
- rank 0's events, in order (one caller's calls to an actor run in the order they were made), which the
  driver prints on its stdout as the one-node trainer does, so the worker's supervisor reads them unchanged;
- the stop request (the driver's SIGTERM or SIGINT), which each training process polls;
- each rank's start (node, local world size) and exit code.

`train_worker` is Ray Train's per-worker function. Ray Train has already joined the process group
(torch.distributed, gloo on CPU, NCCL on GPU) and set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT; the engine joins that group (trainer.distributed.runtime.Runtime uses an
initialised group as it is). The engine runs here as
`python -m trainer run` runs it (trainer.launch.job.run_job), in the same process, with the stop request delivered
by a watcher thread instead of a signal, and agreed over the group at each step's end
(trainer.run.events.AgreedStop, injected into the engine).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import Any

import ray

from contract.protocol import ExitCode
from trainer.launch.command import Refused

STOP_POLL_S = 0.5  # how often a training process asks the relay whether to stop
RELAY_CALL_S = 30.0  # a relay call that takes longer means the driver's node is gone


@ray.remote(num_cpus=0, max_restarts=0)
class Relay:
    """The driver's mailbox in the cluster (see the module's docstring)."""

    def __init__(self) -> None:
        self._events: list[dict[str, Any]] = []
        self._stop: int | None = None
        self._started: dict[int, dict[str, Any]] = {}
        self._exits: dict[int, int] = {}

    def put(self, event: dict[str, Any]) -> None:
        self._events.append(event)

    def drain(self) -> list[dict[str, Any]]:
        events, self._events = self._events, []
        return events

    def request_stop(self, signum: int) -> None:
        if self._stop is None:
            self._stop = signum

    def stop_signal(self) -> int | None:
        return self._stop

    def started(self, rank: int, info: dict[str, Any]) -> None:
        self._started[rank] = info

    def exited(self, rank: int, code: int) -> None:
        self._exits[rank] = code

    def state(self) -> dict[str, Any]:
        return {"started": dict(self._started), "exits": dict(self._exits)}


def _watch_stop(relay: Any, stop: Any, done: threading.Event) -> None:
    """Polls the relay; hands the stop request to the stop policy as a signal handler would."""
    while not done.wait(STOP_POLL_S):
        try:
            signum = ray.get(relay.stop_signal.remote(), timeout=RELAY_CALL_S)
        except Exception:
            continue
        if signum is not None:
            stop.request(int(signum))
            return


def train_worker(config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: one training process of the job, rank from Ray Train's context."""
    os.environ.update(config["env"])  # the trainer's own variables (thread counts, fault injection)
    relay = config["relay"]
    context = ray.train.get_context()
    rank = context.get_world_rank()
    info = {
        "node_id": ray.get_runtime_context().get_node_id(),
        "node_rank": context.get_node_rank(),
        "local_world_size": context.get_local_world_size(),
        "pid": os.getpid(),
    }
    ray.get(relay.started.remote(rank, info), timeout=RELAY_CALL_S)
    code = _run_engine(config, relay, rank)
    ray.get(relay.exited.remote(rank, int(code)), timeout=RELAY_CALL_S)


def _run_engine(config: dict[str, Any], relay: Any, rank: int) -> int:
    # Here, not at the top: the driver imports this module for `Relay` and `train_worker` and must not load
    # the engine (torch, transformers); only the training processes run this.
    from trainer.launch.job import run_job
    from trainer.run.events import AgreedStop

    def relay_event(event: dict[str, Any]) -> None:
        # Waited for: a checkpoint's event is in the relay before the next step starts.
        ray.get(relay.put.remote(event), timeout=RELAY_CALL_S)

    stop = AgreedStop()
    done = threading.Event()
    watcher = threading.Thread(target=_watch_stop, args=(relay, stop, done), daemon=True)
    watcher.start()
    try:
        return run_job(
            config["spec"],
            Path(config["out"]),
            resume=bool(config["resume"]),
            callbacks=[relay_event] if rank == 0 else [],
            progress=False,
            stop=stop,
        )
    except Refused as err:
        print(err, file=sys.stderr, flush=True)
        return ExitCode.USER_ERROR
    finally:
        done.set()
        with contextlib.suppress(RuntimeError):
            watcher.join(timeout=STOP_POLL_S * 4)
