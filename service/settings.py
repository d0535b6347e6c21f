"""The service's settings: one typed class, read from the environment (prefix STARE_) when built.

Nothing here runs at import time: `create_app(Settings(...))` in tests, `Settings()` in the command line.
Placeholder secrets (the defaults below, "change-me" and friends) are accepted only when
`environment == "development"`; any other environment refuses to start with them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PLACEHOLDER_SECRETS = frozenset({"", "change-me", "changeme", "secret", "password", "postgres", "example"})

MIB = 1024 * 1024


class Settings(BaseSettings):
    """Everything one API process needs. Environment variables: STARE_<FIELD> (e.g. STARE_DATABASE_URL)."""

    model_config = SettingsConfigDict(env_prefix="STARE_", extra="ignore", frozen=True)

    environment: Literal["development", "production"] = "development"

    # Storage
    database_url: str = "postgresql+psycopg://stare:change-me@127.0.0.1:5432/stare"
    database_pool_size: Annotated[int, Field(ge=1, le=500)] = 20  # keep ≥ threadpool_size
    threadpool_size: Annotated[int, Field(ge=1, le=1000)] = 16  # threads for sync routes and dependencies
    artifact_root: Path = Path("artifacts")

    # Queue: Celery by task name only; "record" keeps the messages in memory (tests about something else)
    broker_url: str = "redis://:change-me@127.0.0.1:6379/0"
    queue_backend: Literal["celery", "record"] = "celery"
    training_queue: Annotated[str, Field(min_length=1, max_length=100)] = "training"
    train_task_name: str = "worker.train_job"
    broker_timeout_s: Annotated[float, Field(gt=0)] = 2.0
    # Embedded mode: broker_url "filesystem://" keeps Celery messages as files under this folder.
    broker_folder: Path | None = None

    # Limits
    max_upload_bytes: Annotated[int, Field(ge=1)] = 100 * MIB
    max_line_bytes: Annotated[int, Field(ge=16)] = 1 * MIB
    max_json_body_bytes: Annotated[int, Field(ge=1024)] = 1 * MIB
    max_file_errors: Annotated[int, Field(ge=1, le=1000)] = 20
    max_active_jobs_per_tenant: Annotated[int, Field(ge=0)] = 100  # 0: no limit
    # Retry budgets per job (docs/SERVICE.md "Retry budgets"): trainer crashes, and lost workers (infrastructure:
    # a worker that stopped heartbeating, a trainer SIGKILLed from outside). A crash loop stops a job sooner.
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 3
    max_lost_workers: Annotated[int, Field(ge=1, le=1000)] = 10
    # Capacity: the most trainer processes (one per GPU, or CPU processes) any worker of this deployment
    # runs for one job; POST /v1/jobs and /estimate refuse more with 422 naming distributed.num_processes.
    max_processes_per_job: Annotated[int, Field(ge=1, le=4096)] = 8
    rate_limit_per_second: Annotated[float, Field(ge=0)] = 20.0  # 0 disables rate limiting
    rate_limit_burst: Annotated[int, Field(ge=1)] = 100
    # memory: buckets in this process (one API process); redis: shared by several (serve --workers N)
    rate_limit_backend: Literal["memory", "redis"] = "memory"
    rate_limit_redis_url: str | None = None  # default: broker_url
    auth_cache_ttl_s: Annotated[float, Field(ge=0, le=300)] = 5.0  # 0: look every key up every time

    # Catalogue: base models the operator configured on top of trainer.catalog.BUILTIN_MODELS
    extra_models: dict[str, str] = Field(default_factory=dict)

    # Server-sent events
    sse_poll_interval_s: Annotated[float, Field(gt=0)] = 1.0
    sse_keepalive_s: Annotated[float, Field(gt=0)] = 15.0
    sse_max_duration_s: Annotated[float, Field(gt=0)] = 3600.0

    # /metrics: open when unset (restrict it at the network instead), else Bearer <token>
    metrics_token: SecretStr | None = None

    @model_validator(mode="after")
    def _no_placeholder_secrets(self) -> Settings:
        if self.environment == "development":
            return self
        found = [name for name, secret in self._secrets().items() if secret in PLACEHOLDER_SECRETS]
        if found:
            raise ValueError(
                f"placeholder secrets are only allowed in development; set real values for: {', '.join(found)}"
            )
        return self

    def _secrets(self) -> dict[str, str | None]:
        secrets: dict[str, str | None] = {
            "database_url password": _url_password(self.database_url),
            "broker_url password": _url_password(self.broker_url),
        }
        if self.rate_limit_redis_url is not None:
            secrets["rate_limit_redis_url password"] = _url_password(self.rate_limit_redis_url)
        if self.metrics_token is not None:
            secrets["metrics_token"] = self.metrics_token.get_secret_value()
        return {name: value for name, value in secrets.items() if value is not None}

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


def _url_password(url: str) -> str | None:
    """The password in a URL, or None when it has none (trust auth, sockets, SQLite)."""
    try:
        return urlsplit(url).password
    except ValueError:
        return None
