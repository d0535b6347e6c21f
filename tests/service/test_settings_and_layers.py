"""Settings refuse placeholder secrets outside development; the service loads no torch and no worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_placeholder_secrets_are_refused_outside_development() -> None:
    assert Settings(environment="development").database_url.endswith("/stare")  # defaults are fine in dev
    with pytest.raises(ValidationError, match="database_url password"):
        Settings(environment="production", broker_url="redis://:Kx9-real@redis:6379/0")
    with pytest.raises(ValidationError, match="metrics_token"):
        Settings(
            environment="production",
            database_url="postgresql+psycopg://stare:Kx9-real@db/stare",
            broker_url="redis://redis:6379/0",
            metrics_token="change-me",
        )
    real = Settings(
        environment="production",
        database_url="postgresql+psycopg://stare:Kx9-real@db/stare",
        broker_url="redis://:Kx9-real@redis:6379/0",
    )
    assert real.environment == "production"


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STARE_TRAINING_QUEUE", "gpu-a100")
    monkeypatch.setenv("STARE_RATE_LIMIT_PER_SECOND", "7.5")
    settings = Settings()
    assert settings.training_queue == "gpu-a100" and settings.rate_limit_per_second == 7.5


def test_the_service_loads_no_torch_no_transformers_no_worker() -> None:
    script = "import json, sys, service.app, service.__main__; print(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert "service.app" in loaded and "contract.spec" in loaded
    forbidden = {"torch", "transformers", "accelerate", "worker"}
    assert sorted(m for m in loaded if m.split(".")[0] in forbidden) == []


def _loaded_by(imports: str) -> list[str]:
    script = f"import json, sys, {imports}; print(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout)
    return loaded


def test_the_store_loads_neither_the_service_nor_the_worker_nor_fastapi_nor_torch() -> None:
    loaded = _loaded_by("store.repository, store.database, store.migrate, store.settings, store.errors")
    assert "store.repository.leases" in loaded
    forbidden = {"service", "worker", "fastapi", "starlette", "torch"}
    assert sorted(m for m in loaded if m.split(".")[0] in forbidden) == []


def test_the_worker_loads_no_service() -> None:
    loaded = _loaded_by("worker.celery_app, worker.sweeper, worker.metrics, worker.embedded, worker.__main__")
    assert "worker.training" in loaded and "store.repository" in loaded
    assert sorted(m for m in loaded if m.split(".")[0] == "service") == []
