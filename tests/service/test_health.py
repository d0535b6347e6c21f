"""Liveness, readiness (database, broker, migrations at head) and the Prometheus endpoint."""

from __future__ import annotations

import gc
import re
from collections.abc import Callable

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import Postgres, TenantKey
from tests.service.helpers import create_job
from tests.service.test_errors import assert_error


def test_liveness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_ready_with_real_postgres_and_redis(make_client: Callable[..., TestClient]) -> None:
    client = make_client(queue_backend="celery")
    assert client.get("/readyz").json() == {
        "status": "ready",
        "checks": {"database": "ok", "migrations": "ok", "broker": "ok"},
    }


def test_not_ready_when_the_broker_is_down(make_client: Callable[..., TestClient]) -> None:
    client = make_client(queue_backend="celery", broker_url="redis://127.0.0.1:1/0", broker_timeout_s=0.5)
    error = assert_error(client.get("/readyz"), 503, "not_ready")
    assert "broker" in error["message"]


def test_not_ready_when_the_schema_is_behind(
    make_client: Callable[..., TestClient], postgres: Postgres
) -> None:
    name = postgres.create("stare_svc_empty")
    try:
        client = make_client(database_url=postgres.url(name))
        error = assert_error(client.get("/readyz"), 503, "not_ready")
        assert "migrations" in error["message"]
        client.__exit__(None, None, None)
    finally:
        postgres.drop(name)


def test_metrics_report_requests_and_jobs(client: TestClient, tenant: TenantKey) -> None:
    job_id = create_job(client, tenant.headers)
    client.get("/v1/jobs", headers=tenant.headers)
    client.get(f"/v1/jobs/{job_id}", headers=tenant.headers)
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    requests = families["stare_http_requests"].samples
    assert any(
        s.labels == {"route": "/v1/jobs", "method": "GET", "status_class": "2xx"} and s.value >= 1
        for s in requests
    )
    assert any(s.labels["route"] == "/v1/jobs/{job_id}" for s in requests)
    assert not any(
        re.search(r"_[0-9A-Z]{26}", s.labels.get("route", "")) for s in requests
    )  # templates, not ids
    jobs = families["stare_jobs"].samples
    assert any(s.labels == {"status": "queued", "queue": "training"} and s.value >= 1 for s in jobs)
    assert families["stare_database_up"].samples[0].value == 1


def test_metrics_can_require_a_token(make_client: Callable[..., TestClient]) -> None:
    client = make_client(metrics_token="s3cret-token")
    assert_error(client.get("/metrics"), 401)
    assert client.get("/metrics", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200


def test_the_startup_heap_is_frozen_for_the_collector_while_serving(settings: Settings) -> None:
    """Full collections skip what the app built at start (their pauses are the requests' p99), and a
    process that builds many apps (the tests) can still collect the old ones after shutdown."""
    with TestClient(create_app(settings)) as serving:
        assert serving.get("/healthz").status_code == 200
        assert gc.get_freeze_count() > 10_000
    assert gc.get_freeze_count() == 0
