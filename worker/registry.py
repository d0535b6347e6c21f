"""The worker's side of the registry: advertise what it can run, beat, and leave (docs/SERVICE.md).

`capabilities(settings)` is this worker's contract.fleet.WorkerClass (its queue filled in per row by the
store): strategies, nodes (1, or STARE_RAY_NODES behind STARE_RAY_ADDRESS), processes per node (settings,
else the GPUs in CUDA_VISIBLE_DEVICES, else the CPU cores), memory per device (settings, else on CPU the
host's memory over the processes), device kind, rollout engines (hf; vllm when STARE_VLLM_PYTHON is set).
`Registration` registers it on start, renews the heartbeat every registry_heartbeat_s in a daemon thread
(registering again if its rows were removed), and deletes its rows on stop; at start it also deletes
rows that have not beaten for a day (workers killed long ago). A database error in a beat is
logged and retried at the next one: the registry never stops a worker from training.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from contract.fleet import WorkerClass
from store import repository
from store.database import Database
from worker.settings import WorkerSettings

logger = logging.getLogger(__name__)
MIB = 1024 * 1024
FORGET_AFTER = timedelta(days=1)


def visible_gpus() -> int:
    """GPUs named by CUDA_VISIBLE_DEVICES (0 when unset or empty: a CPU worker)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return len([d for d in value.split(",") if d.strip() and d.strip() != "-1"]) if value else 0


def host_memory_bytes() -> int | None:
    try:
        text = Path("/proc/meminfo").read_text(encoding="ascii")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def capabilities(settings: WorkerSettings, queue: str) -> WorkerClass:
    gpus = visible_gpus()
    processes = settings.worker_processes_per_node or gpus or os.cpu_count() or 1
    memory: int | None = None
    if settings.worker_memory_per_device_mib is not None:
        memory = settings.worker_memory_per_device_mib * MIB
    elif not gpus:
        host = host_memory_bytes()
        memory = host // processes if host else None
    nodes = 1
    if settings.ray_address:
        if settings.ray_nodes is None:
            logger.warning("STARE_RAY_ADDRESS is set without STARE_RAY_NODES: advertising 1 node")
        nodes = settings.ray_nodes or 1
    engines = ("hf", "vllm") if settings.vllm_python else ("hf",)
    strategies = tuple(s.strip() for s in settings.worker_strategies.split(",") if s.strip())
    return WorkerClass.model_validate(
        {
            "name": None,
            "queue": queue,
            "strategies": strategies,
            "nodes": nodes,
            "processes_per_node": processes,
            "memory_per_device_bytes": memory,
            "device": "cuda" if gpus else "cpu",
            "rollout_engines": engines,
        }
    )


class Registration:
    """This worker's rows in the registry for as long as it runs."""

    def __init__(self, db: Database, settings: WorkerSettings, worker_id: str, queues: Sequence[str]) -> None:
        self.db, self.settings, self.worker_id, self.queues = db, settings, worker_id, list(queues)
        self.capabilities: dict[str, Any] = capabilities(settings, self.queues[0]).model_dump(mode="json")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self) -> None:
        with self.db.transaction() as session:
            repository.register_worker(session, self.worker_id, self.capabilities, self.queues)

    def beat(self) -> None:
        with self.db.transaction() as session:
            renewed = repository.worker_heartbeat(session, self.worker_id)
        if renewed < len(self.queues):
            self.register()

    def start(self) -> Registration:
        try:
            self.register()
            with self.db.transaction() as session:  # rows of workers gone for a day: housekeeping
                repository.forget_workers(session, FORGET_AFTER)
        except Exception:  # the database is down: the heartbeat thread registers once it is back
            logger.exception("could not register %s yet; retrying at each heartbeat", self.worker_id)
        self._thread = threading.Thread(target=self._run, name="registry-heartbeat", daemon=True)
        self._thread.start()
        logger.info("registered %s on %s: %s", self.worker_id, ",".join(self.queues), self.capabilities)
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.settings.registry_heartbeat_s):
            try:
                self.beat()
            except Exception:  # a database outage: the next beat tries again
                logger.exception("registry heartbeat of %s failed", self.worker_id)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            with self.db.transaction() as session:
                repository.remove_worker(session, self.worker_id)
        except Exception:
            logger.exception("could not remove %s from the registry (it expires by itself)", self.worker_id)
