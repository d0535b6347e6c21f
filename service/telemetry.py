"""Prometheus metrics of the API process: HTTP requests (RED) and jobs by status and queue.

Each app has its own CollectorRegistry (tests build many apps). Labels are bounded: route template, method,
status class; status and queue. Names, help and labels are contract.metrics.API_SERIES (docs/metrics.md). The worker's per-job collector (latest step values of active jobs) can be
added with `Telemetry.registry.register(...)`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contract.metrics import API_SERIES, FleetSeries
from store import repository
from store.database import Database

logger = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SERIES = {series.name: series for series in API_SERIES}


def _series(name: str) -> FleetSeries:
    return _SERIES[name]


def _base(name: str) -> str:
    """prometheus_client's name for a counter: the exposed name less `_total` (the client adds it)."""
    return name.removesuffix("_total")


class JobCountCollector(Collector):
    """stare_jobs{status, queue}: read from the database at scrape time (no state kept in the process)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        jobs_series, up_series = _series("stare_jobs"), _series("stare_database_up")
        jobs = GaugeMetricFamily(jobs_series.name, jobs_series.help, labels=list(jobs_series.labels))
        up = GaugeMetricFamily(up_series.name, up_series.help)
        try:
            with self.db.sessions() as session:
                counts = repository.job_status_counts(session)
        except Exception:
            logger.warning("could not count jobs for /metrics", exc_info=True)
            up.add_metric([], 0)
            yield up
            return
        for status, queue, count in counts:
            jobs.add_metric([status, queue], count)
        up.add_metric([], 1)
        yield jobs
        yield up


class Telemetry:
    def __init__(self, db: Database) -> None:
        self.registry = CollectorRegistry(auto_describe=False)  # never query the database at start-up
        requests = _series("stare_http_requests_total")
        self.requests = Counter(
            _base(requests.name), requests.help, list(requests.labels), registry=self.registry
        )
        latency = _series("stare_http_request_duration_seconds")
        self.latency = Histogram(
            latency.name, latency.help, list(latency.labels), buckets=LATENCY_BUCKETS, registry=self.registry
        )
        failures = _series("stare_enqueue_failures_total")
        self.enqueue_failures = Counter(_base(failures.name), failures.help, registry=self.registry)
        self.registry.register(JobCountCollector(db))


class TelemetryMiddleware:
    """Counts requests by route template (never the raw path: ids would explode the label set)."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route: Any = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            self.telemetry.requests.labels(template, method, f"{status // 100}xx").inc()
            self.telemetry.latency.labels(template, method).observe(time.perf_counter() - start)
