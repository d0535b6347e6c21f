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
    # interpreter for a job with rollout.engine vllm (vLLM pins its own transformers: `make install` builds
    # .venv-vllm for it); empty: `python`
    vllm_python: str = ""
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
