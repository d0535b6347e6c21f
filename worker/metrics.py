"""Prometheus exposition of the training fleet: the latest per-step values of active jobs, and queue and
worker gauges.

The collector keeps no state: at each scrape it reads the active jobs (running, pausing, cancelling) and
their latest metric snapshot from the database, and the queue depth from the broker. A finished job is no
longer active, so its series vanish from the next scrape. Labels are job_id, algorithm and queue only
(never step, tenant or prompt: bounded cardinality).

Run it with `python -m worker exporter --port 9464`. What it publishes, names and help included, is
contract.metrics' catalogue (docs/metrics.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime

import sqlalchemy as sa
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from contract import metrics as metric_catalogue
from contract.numbers import finite
from store.database import Database
from store.models import LEASED_STATUSES, Job
from worker.broker import queue_depth_reader

logger = logging.getLogger(__name__)

JOB_LABELS = list(metric_catalogue.JOB_LABELS)
# The trainer's metrics the exporter publishes: their keys, series names and help from the catalogue.
JOB_METRICS = metric_catalogue.prometheus_metrics()


def _gauge(name: str) -> GaugeMetricFamily:
    series = metric_catalogue.fleet_series(name)
    return GaugeMetricFamily(series.name, series.help, labels=list(series.labels))


class FleetCollector(Collector):
    def __init__(
        self, db: Database, broker_url: str | None = None, queues: tuple[str, ...] = ("training",)
    ) -> None:
        self.db, self.broker_url, self.queues = db, broker_url, queues
        self._depth = queue_depth_reader(broker_url, timeout_s=1.0)

    def collect(self) -> Iterator[Metric]:
        families = {
            metric.key: GaugeMetricFamily(metric.prometheus, metric.series_help, labels=JOB_LABELS)
            for metric in JOB_METRICS
            if metric.prometheus is not None
        }
        step = _gauge("stare_job_step")
        total = _gauge("stare_job_total_steps")
        heartbeat_age = _gauge("stare_job_heartbeat_age_seconds")
        busy = _gauge("stare_workers_busy")
        depth = _gauge("stare_queue_messages")
        up = _gauge("stare_fleet_scrape_ok")
        now = datetime.now(UTC)
        try:
            with self.db.sessions() as session:
                rows = session.execute(
                    sa.select(
                        Job.id,
                        Job.algorithm,
                        Job.queue,
                        Job.current_step,
                        Job.total_steps,
                        Job.heartbeat_at,
                        Job.last_metrics,
                        Job.lease_owner,
                    ).where(Job.status.in_(LEASED_STATUSES))
                ).all()
        except Exception:
            logger.warning("fleet scrape could not read the database", exc_info=True)
            up.add_metric([], 0)
            yield up
            return
        owners: dict[str, set[str]] = {}
        for row in rows:
            labels = [row.id, row.algorithm, row.queue]
            metrics = row.last_metrics or {}
            for key, family in families.items():
                value = finite(metrics.get(key))
                if value is not None:
                    family.add_metric(labels, value)
            step.add_metric(labels, float(row.current_step or 0))
            total.add_metric(labels, float(row.total_steps))
            if row.heartbeat_at is not None:
                beat = row.heartbeat_at if row.heartbeat_at.tzinfo else row.heartbeat_at.replace(tzinfo=UTC)
                heartbeat_age.add_metric(labels, max(0.0, (now - beat).total_seconds()))
            owners.setdefault(row.queue, set()).add(row.lease_owner or "")
        for queue in sorted(set(self.queues) | set(owners)):
            busy.add_metric([queue], float(len(owners.get(queue, ()))))
        yield from families.values()
        yield step
        yield total
        yield heartbeat_age
        yield busy
        for queue, count in self._queue_depths():
            depth.add_metric([queue], float(count))
        yield depth
        up.add_metric([], 1)
        yield up

    def _queue_depths(self) -> list[tuple[str, int]]:
        """(queue, messages waiting) for the queues whose depth can be read (a Redis broker)."""
        depths = [(queue, self._depth(queue)) for queue in self.queues]
        return [(queue, count) for queue, count in depths if count is not None]
