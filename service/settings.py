"""The service's settings: the shared ones (store.settings.SharedSettings: database, broker and queue,
artifact root, retry budgets) plus what only the API uses, read from the environment (prefix STARE_) when
built.

Nothing here runs at import time: `create_app(Settings(...))` in tests, `Settings()` in the command line.
Placeholder secrets (the defaults, "change-me" and friends) are accepted only when
`environment == "development"`; any other environment refuses to start with them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr, model_validator

from contract.catalog import model_config_problem
from contract.fleet import Offer, WorkerClass
from store.settings import SharedSettings, url_password

MIB = 1024 * 1024


class Settings(SharedSettings):
    """Everything one API process needs. Environment variables: STARE_<FIELD> (e.g. STARE_DATABASE_URL)."""

    threadpool_size: Annotated[int, Field(ge=1, le=1000)] = 16  # threads for sync routes and dependencies

    # "record" keeps the doorbell's messages in memory (tests about something else)
    queue_backend: Literal["celery", "record"] = "celery"

    # Limits
    max_upload_bytes: Annotated[int, Field(ge=1)] = 100 * MIB
    max_line_bytes: Annotated[int, Field(ge=16)] = 1 * MIB
    max_json_body_bytes: Annotated[int, Field(ge=1024)] = 1 * MIB
    # Values (strings, numbers, containers, keys) in one JSON body: a body with more is refused before it
    # is parsed (contract.safejson). A spec or a dry run holds a few hundred.
    max_json_values: Annotated[int, Field(ge=100, le=1_000_000)] = 10_000
    # Processes that check large JSON bodies (service/body_checks.py), started on the first; 0: a thread.
    body_check_processes: Annotated[int, Field(ge=0, le=64)] = 2
    max_file_errors: Annotated[int, Field(ge=1, le=1000)] = 20
    max_active_jobs_per_tenant: Annotated[int, Field(ge=0)] = 100  # 0: no limit
    # Capacity (docs/SERVICE.md, "Placement"): POST /v1/jobs and /estimate refuse a job that no live worker
    # (the registry) and no declared worker class can run, 422 exceeds_capacity naming the field, and route
    # the rest to the queue of a class that can. worker_classes (STARE_WORKER_CLASSES, a JSON list of
    # contract.fleet.WorkerClass) declares capacity that is not up yet; unset, the deployment declares one
    # class: the training queue, one node, max_processes_per_job processes, memory not stated.
    max_processes_per_job: Annotated[int, Field(ge=1, le=4096)] = 8
    worker_classes: list[WorkerClass] | None = None
    # worker_stale_after_s (a silent worker stops counting) is shared with the exporter: store.settings.
    worker_registry_cache_s: Annotated[float, Field(ge=0, le=60)] = 2.0  # 0: read the registry every time
    rate_limit_per_second: Annotated[float, Field(ge=0)] = 20.0  # per API key; 0 disables rate limiting
    rate_limit_burst: Annotated[int, Field(ge=1)] = 100
    # Per tenant, over all its keys (a tenant cannot multiply its rate by minting keys); 0: no tenant limit.
    tenant_rate_limit_per_second: Annotated[float, Field(ge=0)] = 40.0
    tenant_rate_limit_burst: Annotated[int, Field(ge=1)] = 200
    # Requests that prove no key yet (none sent, a wrong one, one not in the principal cache, a sign-in)
    # spend a token of their source address's bucket before any lookup: 0 disables it.
    address_rate_limit_per_second: Annotated[float, Field(ge=0)] = 10.0
    address_rate_limit_burst: Annotated[int, Field(ge=1)] = 100
    max_active_keys_per_tenant: Annotated[int, Field(ge=0)] = 20  # POST /v1/api-keys past it: 409; 0: none
    # memory: buckets in this process (one API process); redis: shared by several (serve --workers N)
    rate_limit_backend: Literal["memory", "redis"] = "memory"
    rate_limit_redis_url: str | None = None  # default: broker_url
    auth_cache_ttl_s: Annotated[float, Field(ge=0, le=300)] = 5.0  # 0: look every key up every time

    # Catalogue: base models the operator configured on top of contract.catalog.BUILTIN_MODELS
    extra_models: dict[str, str] = Field(default_factory=dict)
    # The HF config shape fields of extra models (as contract.catalog.BUILTIN_CONFIGS; bench/make_config_model.py
    # prints them), so that their memory per device is estimated and refused on like a built-in model's.
    # An extra model without one is not estimated.
    extra_model_configs: dict[str, dict[str, int | bool]] = Field(default_factory=dict)

    # Server-sent events
    sse_poll_interval_s: Annotated[float, Field(gt=0)] = 1.0
    sse_keepalive_s: Annotated[float, Field(gt=0)] = 15.0
    sse_max_duration_s: Annotated[float, Field(gt=0)] = 3600.0

    # /metrics: open when unset (restrict it at the network instead), else Bearer <token>
    metrics_token: SecretStr | None = None

    # Tool-use jobs (spec environment.limits, docs/TOOLS.md): the most one tool call may use on this
    # deployment's workers. POST /v1/jobs and /estimate refuse more with 422 naming the field.
    tool_max_cpu_seconds: Annotated[float, Field(gt=0, le=600)] = 10.0
    tool_max_wall_seconds: Annotated[float, Field(gt=0, le=600)] = 30.0
    tool_max_memory_mb: Annotated[int, Field(ge=32, le=65_536)] = 1024
    tool_max_processes: Annotated[int, Field(ge=1, le=4096)] = 32
    tool_max_output_bytes: Annotated[int, Field(ge=16, le=16 * MIB)] = 64 * 1024
    tool_max_turns: Annotated[int, Field(ge=1, le=32)] = 8

    # Task generation and verifier dry runs (service/offload.py) run in child processes, at most
    # task_check_processes at once and one per tenant (task_check_queue_per_tenant more of a tenant's wait;
    # past that a 429), each call within a wall clock and an address-space limit; past either is a 422
    # naming the field. The children run under bubblewrap (service/offload_confine.py): false turns that
    # off, where the operator isolates the API otherwise. Prewarm starts the children with the app.
    task_check_seconds: Annotated[float, Field(gt=0, le=600)] = 10.0
    task_check_memory_mb: Annotated[int, Field(ge=256, le=65_536)] = 1024
    task_check_processes: Annotated[int, Field(ge=1, le=64)] = 3
    task_check_queue_per_tenant: Annotated[int, Field(ge=0, le=1000)] = 4
    task_check_isolation: bool = True
    task_check_prewarm: bool = True

    # Tenant graders (docs/GRADERS.md): the most one sandboxed grader process may use here (OpenAI's python
    # grader limits are the defaults and the ceilings; an operator may lower them), the pool size a job may
    # ask, and how many grader runs (validate, run, a job's loophole check) one tenant and the API may have
    # in flight at once (one more from a tenant is a 429).
    grader_max_timeout_s: Annotated[float, Field(gt=0, le=120)] = 120.0
    grader_max_memory_mb: Annotated[int, Field(ge=128, le=2048)] = 2048
    grader_max_disk_mb: Annotated[int, Field(ge=32, le=1024)] = 1024
    grader_max_workers: Annotated[int, Field(ge=1, le=32)] = 4
    grader_runs_per_tenant: Annotated[int, Field(ge=1, le=64)] = 2
    grader_runs_total: Annotated[int, Field(ge=1, le=256)] = 4

    def grader_limits(self) -> dict[str, float]:
        """grader limit field (under spec.grading.limits) -> the most this deployment allows."""
        return {
            "timeout_s": self.grader_max_timeout_s,
            "memory_mb": self.grader_max_memory_mb,
            "disk_mb": self.grader_max_disk_mb,
        }

    def tool_limits(self) -> dict[str, float]:
        """environment field (dotted after spec.environment) -> the most this deployment allows."""
        return {
            "limits.cpu_seconds": self.tool_max_cpu_seconds,
            "limits.wall_seconds": self.tool_max_wall_seconds,
            "limits.memory_mb": self.tool_max_memory_mb,
            "limits.processes": self.tool_max_processes,
            "limits.output_bytes": self.tool_max_output_bytes,
            "max_turns": self.tool_max_turns,
        }

    # The job page (service/routers/pages.py): sign-in sessions are signed cookies (service/sessions.py).
    # Unset: a random secret per process, so sign-ins end when the API restarts; set it when several API
    # processes serve the page (serve --workers N) or sign-ins should survive a restart.
    session_secret: SecretStr | None = None
    session_ttl_s: Annotated[float, Field(ge=60, le=30 * 24 * 3600)] = 8 * 3600.0

    def declared_offers(self) -> list[Offer]:
        """The declared worker classes (or the default one) as placement offers."""
        if self.worker_classes is None:
            default = WorkerClass(
                name="default", queue=self.training_queue, processes_per_node=self.max_processes_per_job
            )
            label = f"the default class on queue {self.training_queue!r}, STARE_MAX_PROCESSES_PER_JOB"
            return [Offer(label, default, live=False)]
        return [
            Offer(f"declared class {c.name or c.queue!r} on queue {c.queue!r}", c, live=False)
            for c in self.worker_classes
        ]

    @model_validator(mode="after")
    def _extra_model_configs_are_shapes(self) -> Settings:
        for name, config in self.extra_model_configs.items():
            if name not in self.extra_models:
                raise ValueError(f"extra_model_configs: {name!r} is not one of extra_models")
            problem = model_config_problem(config)
            if problem is not None:
                raise ValueError(f"extra_model_configs.{name}: {problem}")
        return self

    @model_validator(mode="after")
    def _distinct_class_names(self) -> Settings:
        names = [c.name for c in self.worker_classes or () if c.name is not None]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"worker_classes: names must be distinct, repeated: {', '.join(repeated)}")
        return self

    def _secrets(self) -> dict[str, str | None]:
        secrets = super()._secrets()
        if self.rate_limit_redis_url is not None:
            secrets["rate_limit_redis_url password"] = url_password(self.rate_limit_redis_url)
        if self.metrics_token is not None:
            secrets["metrics_token"] = self.metrics_token.get_secret_value()
        if self.session_secret is not None:
            secrets["session_secret"] = self.session_secret.get_secret_value()
        return {name: value for name, value in secrets.items() if value is not None}
