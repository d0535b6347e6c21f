"""Prometheus: `python -m worker exporter` reports the latest per-step values of active jobs (labels job_id,
algorithm, queue only) and worker/queue gauges; a finished (here: cancelled) job's series vanish from the
next scrape."""

from __future__ import annotations

import sys
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import free_port
from tests.worker.harness import Harness, WorkerProcess, record_figures, tiny_spec

pytestmark = pytest.mark.slow


def _scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    response = httpx.get(url, timeout=10)
    response.raise_for_status()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return found


def _job_series(scrape: dict[str, list[tuple[dict[str, str], float]]], job_id: str) -> dict[str, float]:
    return {
        name: value
        for name, samples in scrape.items()
        for labels, value in samples
        if labels.get("job_id") == job_id
    }


def test_exporter_reports_active_jobs_only(harness: Harness) -> None:
    h = harness
    port = free_port()
    exporter = WorkerProcess(
        "exporter",
        [sys.executable, "-m", "worker", "exporter", "--port", str(port)],
        h.worker_env(),
        h.tmp_path / "exporter.log",
    )
    h.workers.append(exporter)
    h.start_worker()
    url = f"http://127.0.0.1:{port}/metrics"
    job_id = h.post_job(tiny_spec(40, 5))  # long enough to scrape; cancelled below
    h.wait_step(job_id, 2, timeout=150)

    def active() -> dict[str, Any] | None:
        try:
            scrape = _scrape(url)
        except httpx.HTTPError:
            return None
        series = _job_series(scrape, job_id)
        return {"scrape": scrape, "series": series} if "stare_job_entropy_nats" in series else None

    found = h.wait_for("the exporter to report the running job", active, timeout=60, job_id=job_id)
    scrape, series = found["scrape"], found["series"]
    for name in (
        "stare_job_step",
        "stare_job_total_steps",
        "stare_job_heartbeat_age_seconds",
        "stare_job_entropy_nats",
        "stare_job_entropy_band_low_nats",
        "stare_job_entropy_band_high_nats",
        "stare_job_gate_on",
        "stare_job_accuracy",
        "stare_job_tokens_per_second",
    ):
        assert name in series, f"{name} missing: {sorted(series)}"
    assert series["stare_job_total_steps"] == 40
    # The exporter reads the job row: its step lies between the step waited for and the row's step now.
    assert 2 <= series["stare_job_step"] <= h.job_row(job_id)["current_step"] < 40
    assert series["stare_job_heartbeat_age_seconds"] < 10
    for samples in scrape.values():
        for labels, _ in samples:
            if "job_id" in labels:
                assert set(labels) == {"job_id", "algorithm", "queue"}, labels
                if labels["job_id"] == job_id:
                    assert labels["queue"] == h.queue and labels["algorithm"] == "stare"
    busy = {labels["queue"]: value for labels, value in scrape["stare_workers_busy"]}
    assert busy.get(h.queue) == 1

    assert h.api("POST", f"/v1/jobs/{job_id}/cancel").status_code == 200
    h.wait_status(job_id, "cancelled", timeout=90)
    after = _scrape(url)
    assert _job_series(after, job_id) == {}, "a finished job's series vanish"
    assert {labels["queue"]: value for labels, value in after["stare_workers_busy"]}.get(h.queue) == 0
    record_figures("test_exporter_reports_active_jobs_only", job_series_while_running=len(series))
