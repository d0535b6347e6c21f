"""Prometheus metrics of the API process: HTTP requests (RED) and jobs by status and queue.

Each app has its own CollectorRegistry (tests build many apps). Labels are bounded: route template, method,
status class; status and queue. The worker's per-job collector (latest step values of active jobs) can be
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

from store import repository
from store.database import Database

logger = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class JobCountCollector(Collector):
    """stare_jobs{status, queue}: read from the database at scrape time (no state kept in the process)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("stare_jobs", "Jobs by status and queue.", labels=["status", "queue"])
        up = GaugeMetricFamily("stare_database_up", "1 when the last scrape could read the database.")
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
        self.requests = Counter(
            "stare_http_requests",
            "HTTP requests served.",
            ["route", "method", "status_class"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "stare_http_request_duration_seconds",
            "Time to the end of the response.",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.enqueue_failures = Counter(
            "stare_enqueue_failures",
            "Jobs committed whose doorbell could not be sent.",
            registry=self.registry,
        )
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
