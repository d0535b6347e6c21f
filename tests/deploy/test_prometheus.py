"""Prometheus for real: the shipped config and alert rules pass promtool, and a real Prometheus server
scraping the fleet exporter sees an active job's latest step values, labelled job_id/algorithm/queue
only, and loses the series once the job finishes."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import start_http_server

from store import migrate, repository
from store.database import Database
from tests.conftest import requires_binary
from tests.service.helpers import new_job
from tests.services import PostgresServer
from worker.metrics import FleetCollector

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "prometheus"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = requires_binary("prometheus", "promtool")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@needs_prometheus
def test_config_and_rules_pass_promtool(tmp_path):
    assert PROMTOOL is not None
    shutil.copy(DEPLOY / "alerts.yml", tmp_path / "alerts.yml")
    config = (
        (DEPLOY / "prometheus.yml")
        .read_text()
        .replace("/etc/prometheus/alerts.yml", str(tmp_path / "alerts.yml"))
    )
    (tmp_path / "prometheus.yml").write_text(config)
    for args in (
        ["check", "config", str(tmp_path / "prometheus.yml")],
        ["check", "rules", str(DEPLOY / "alerts.yml")],
    ):
        done = subprocess.run([PROMTOOL, *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run(
        [PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=DEPLOY, capture_output=True, text=True
    )
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


@pytest.fixture
def database(test_postgres: PostgresServer) -> Iterator[Database]:
    name = test_postgres.create("stare_prom_test")
    url = test_postgres.url(name)
    migrate.upgrade(url)
    db = Database(url, pool_size=2)
    try:
        yield db
    finally:
        db.dispose()
        test_postgres.drop(name)


def _running_job(db: Database) -> tuple[str, str]:
    from contract.spec import TrainSpec

    spec = TrainSpec.model_validate({"algorithm": {"name": "stare"}, "optim": {"steps": 10}})
    with db.transaction() as session:
        tenant = repository.create_tenant(session, f"t-{uuid.uuid4().hex[:8]}")
    job, _ = asyncio.run(
        repository.create_job(
            db.async_pool,
            new_job(tenant.id, spec=spec.model_dump(mode="json"), resolved_spec=spec.resolved()),
        )
    )
    with db.transaction() as session:
        claim = repository.claim_job(session, job.id, owner="test-worker", lease_s=60)
        assert claim is not None
        assert repository.record_step_metrics(
            session,
            job.id,
            claim.lease_token,
            3,
            {
                "entropy/mean": 0.42,
                "entropy/band_state": 0.0,
                "stare/gate_on": 1.0,
                "reward/accuracy": 0.5,
                "quadrant/pos_high_fraction": 0.1,
                "perf/tokens_per_second": 1234.0,
            },
        )
    return job.id, claim.lease_token


def _query(port: int, expr: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.loads(response.read())
    assert body["status"] == "success"
    return list(body["data"]["result"])


def _wait_for(predicate, timeout: float, what: str) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@needs_prometheus
def test_real_prometheus_scrapes_active_jobs_and_drops_finished_ones(database, tmp_path):
    assert PROMETHEUS is not None
    job_id, token = _running_job(database)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(database, None, ("training",)))
    exporter_port, prom_port = _free_port(), _free_port()
    server, thread = start_http_server(exporter_port, addr="127.0.0.1", registry=registry)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: stare-fleet\n    static_configs: [{{targets: ['127.0.0.1:{exporter_port}']}}]\n"
    )
    prom = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def entropy_series():
            try:
                return _query(prom_port, "stare_job_entropy_nats")
            except OSError:
                return None

        series = _wait_for(entropy_series, 60, "Prometheus to scrape the exporter")
        assert len(series) == 1
        labels = dict(series[0]["metric"])
        assert float(series[0]["value"][1]) == pytest.approx(0.42)
        labels.pop("__name__")
        assert labels.pop("instance") and labels.pop("job") == "stare-fleet"  # added by Prometheus itself
        assert labels == {"job_id": job_id, "algorithm": "stare", "queue": "training"}
        assert float(_query(prom_port, "stare_job_step")[0]["value"][1]) == 3.0
        assert float(_query(prom_port, "stare_job_gate_on")[0]["value"][1]) == 1.0
        assert float(_query(prom_port, "stare_workers_busy")[0]["value"][1]) == 1.0

        with database.transaction() as session:
            assert repository.finish_job(session, job_id, token, "succeeded")
        _wait_for(lambda: entropy_series() == [], 30, "the finished job's series to vanish")
        assert _query(prom_port, "stare_job_step") == []
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        server.shutdown()
        thread.join(timeout=5)
