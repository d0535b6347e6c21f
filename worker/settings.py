"""The worker's settings: the service's (database, broker, artifact root, queue) plus supervision timings.

Read from the environment (prefix STARE_) when built, never at import time.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from store.settings import SharedSettings as Settings


class WorkerSettings(Settings):
    heartbeat_s: Annotated[float, Field(gt=0)] = 10.0  # how often a running job's lease is renewed
    lease_s: Annotated[float, Field(gt=0)] = 60.0  # lease length written at each heartbeat
    stale_after_s: Annotated[float, Field(gt=0)] = 30.0  # the sweeper's "worker lost" threshold (~3 beats)
    sweep_interval_s: Annotated[float, Field(gt=0)] = 10.0
    unclaimed_after_s: Annotated[float, Field(gt=0)] = (
        120.0  # re-ring the doorbell of jobs unclaimed this long
    )
    db_retry_max_s: Annotated[float, Field(gt=0)] = 300.0  # ride out a database outage this long
    cancel_grace_s: Annotated[float, Field(gt=0)] = 120.0  # SIGTERM → SIGKILL for a trainer that won't stop
    python: str = ""  # interpreter for the trainer child; empty: this one
    # The trainer child runs confined by bubblewrap (worker/isolation.py, docs/SECURITY.md): it sees only its
    # own job. Without bwrap the worker refuses to start; false (STARE_TRAINER_ISOLATION=false) turns the
    # confinement off, for a host where the operator isolates each worker otherwise (one VM per tenant).
    trainer_isolation: bool = True
    # A root worker's trainers switch to this uid (and gid) inside their confinement (worker/isolation.py):
    # a trainer must never be uid 0, whose /proc/sys and root-only files no capability check guards.
    trainer_uid: Annotated[int, Field(ge=1, le=2**32 - 2)] = 65534
    # In production a worker started as root drops to this user (a name or a uid) before anything else, or
    # refuses to start without it (worker/__main__.py). The images run it as `stare` already.
    worker_user: str | None = None
    # interpreter for a job with rollout.engine vllm (vLLM pins its own transformers: `make install` builds
    # .venv-vllm for it); empty: `python`
    vllm_python: str = ""

    # The worker registry (docs/SERVICE.md, "Placement"): what this worker advertises, and how often it beats.
    # The service stops counting a worker whose last beat is older than its STARE_WORKER_STALE_AFTER_S
    # (60 s by default: keep registry_heartbeat_s well under it).
    registry_heartbeat_s: Annotated[float, Field(gt=0, le=3600)] = 15.0
    # Processes (one per GPU, or CPU processes) one job may use on this worker's node; unset: the GPUs in
    # CUDA_VISIBLE_DEVICES, else the CPU cores.
    worker_processes_per_node: Annotated[int, Field(ge=1, le=4096)] | None = None
    # Memory of one device in MiB; unset: on CPU, the host's memory divided by processes per node; on GPU,
    # not stated (the worker never touches CUDA), so the service does not refuse on memory for it.
    worker_memory_per_device_mib: Annotated[int, Field(ge=1)] | None = None
    worker_strategies: str = "ddp,fsdp2"  # comma-separated
    # A Ray cluster this worker drives jobs with distributed.nodes > 1 on (docs/DISTRIBUTED.md): "auto" (this
    # host is a Ray node), "HOST:PORT" of the head's GCS, or "ray://HOST:10001"; empty: no multi-node jobs.
    ray_address: str = ""
    ray_connect_timeout_s: Annotated[float, Field(gt=0)] = 30.0  # no answer by then: ray_unavailable
    # every training process placed by then, or ray_unavailable (a node being replaced has this long)
    ray_start_timeout_s: Annotated[float, Field(gt=0)] = 180.0
    # the cluster silent this long: ray_unavailable
    ray_health_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    ray_cpus_per_worker: Annotated[float, Field(ge=0)] = 1.0  # Ray resources of each training process
    ray_gpus_per_worker: Annotated[float, Field(ge=0)] = 0.0
    # How many nodes a job may span on that cluster, advertised in the registry (STARE_RAY_NODES; unset with
    # an address: 1, logged as a warning).
    ray_nodes: Annotated[int, Field(ge=1, le=1024)] | None = None
