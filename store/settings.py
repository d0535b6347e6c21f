"""What the API and the workers share, read from the environment (prefix STARE_) when built: the
database, the broker and its queue, the artifact root, the retry budgets. service.settings.Settings (the
API's limits, rate limiter, SSE, /metrics) and worker.settings.WorkerSettings (supervision timings) extend
it; nothing is built at import time.

Placeholder secrets (the defaults below, "change-me" and friends) are accepted only when
`environment == "development"`; any other environment refuses to start with them. A subclass with more
secrets adds them in `_secrets`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PLACEHOLDER_SECRETS = frozenset({"", "change-me", "changeme", "secret", "password", "postgres", "example"})


class SharedSettings(BaseSettings):
    """Environment variables: STARE_<FIELD> (e.g. STARE_DATABASE_URL)."""

    model_config = SettingsConfigDict(env_prefix="STARE_", extra="ignore", frozen=True)

    environment: Literal["development", "production"] = "development"

    # Storage
    database_url: str = "postgresql+psycopg://stare:change-me@127.0.0.1:5432/stare"
    database_pool_size: Annotated[int, Field(ge=1, le=500)] = 20  # API: keep ≥ threadpool_size
    artifact_root: Path = Path("artifacts")

    # Queue: Celery by task name only (the API rings, the workers consume)
    broker_url: str = "redis://:change-me@127.0.0.1:6379/0"
    training_queue: Annotated[str, Field(min_length=1, max_length=100)] = "training"
    train_task_name: str = "worker.train_job"
    broker_timeout_s: Annotated[float, Field(gt=0)] = 2.0
    # Embedded mode: broker_url "filesystem://" keeps Celery messages as files under this folder.
    broker_folder: Path | None = None

    # Retry budgets per job (docs/SERVICE.md "Retry budgets"): trainer crashes, and lost workers (infrastructure:
    # a worker that stopped heartbeating, a trainer SIGKILLed from outside). A crash loop stops a job sooner.
    max_attempts: Annotated[int, Field(ge=1, le=100)] = 3
    max_lost_workers: Annotated[int, Field(ge=1, le=1000)] = 10

    # The worker registry (store.repository.workers): a worker whose last beat is older than this no longer
    # counts as live, for placement (the API) and for "no live worker serves this queue" (the job view, the
    # exporter's stare_jobs_without_worker). Keep the workers' STARE_REGISTRY_HEARTBEAT_S well under it.
    worker_stale_after_s: Annotated[float, Field(gt=0, le=86_400)] = 60.0

    @model_validator(mode="after")
    def _no_placeholder_secrets(self) -> SharedSettings:
        if self.environment == "development":
            return self
        found = [name for name, secret in self._secrets().items() if secret in PLACEHOLDER_SECRETS]
        if found:
            raise ValueError(
                f"placeholder secrets are only allowed in development; set real values for: {', '.join(found)}"
            )
        return self

    def _secrets(self) -> dict[str, str | None]:
        """Each secret that is set, by name (a URL without a password has none)."""
        secrets = {
            "database_url password": url_password(self.database_url),
            "broker_url password": url_password(self.broker_url),
        }
        return {name: value for name, value in secrets.items() if value is not None}

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")


def url_password(url: str) -> str | None:
    """The password in a URL, or None when it has none (trust auth, sockets, SQLite)."""
    try:
        return urlsplit(url).password
    except ValueError:
        return None


def broker_transport_options(broker_url: str, broker_folder: str | None, timeout_s: float) -> dict[str, Any]:
    """Transport options shared by the API (producer) and the workers (consumers): socket timeouts for
    Redis, or the message folders of Celery's filesystem transport (the embedded mode, no Redis)."""
    if broker_url.startswith("filesystem://"):
        if not broker_folder:
            raise ValueError("broker_url filesystem:// needs broker_folder (STARE_BROKER_FOLDER)")
        root = Path(broker_folder)
        for sub in ("queue", "processed", "control"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        return {
            "data_folder_in": str(root / "queue"),
            "data_folder_out": str(root / "queue"),
            "processed_folder": str(root / "processed"),
            "store_processed": False,
            "control_folder": str(root / "control"),
        }
    return {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
