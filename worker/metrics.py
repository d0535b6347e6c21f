"""Prometheus exposition of the training fleet: the latest per-step values and the latest evaluation of
active jobs, failed jobs by error code, and queue and worker gauges.

The collector keeps no state: at each scrape it reads the active jobs (running, pausing, cancelling), their
latest metric snapshot and latest evaluation from the database, the failed jobs' error codes, the queue
depth from the broker, the jobs that wait in a queue no live worker serves (the worker registry), and
(Redis broker) the idle workers of each queue, by a Celery ping. A finished
job is no longer active, so its series vanish from the next scrape. Labels are job_id, algorithm and queue
only (never step, tenant or prompt: bounded cardinality); the failed-jobs series adds the error code, a
closed set (JOB_FAILURE_CODES, each published with 0 too, so alerts and panels always have a series).

Run it with `python -m worker exporter --port 9464`. What it publishes, names and help included, is
contract.metrics' catalogue (docs/metrics.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC
from typing import Any

import sqlalchemy as sa
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from contract import metrics as metric_catalogue
from contract.numbers import finite
from contract.protocol import JOB_FAILURE_CODES, EventType
from store.database import Database
from store.models import LEASED_STATUSES, Job
from store.repository import db_now, jobs_without_worker
from store.repository.monitoring import failed_job_counts, latest_evals
from worker.broker import REDIS_SCHEMES, queue_depth_reader

logger = logging.getLogger(__name__)

JOB_LABELS = list(metric_catalogue.JOB_LABELS)
# The trainer's metrics the exporter publishes: their keys, series names and help from the catalogue.
JOB_METRICS = metric_catalogue.prometheus_metrics()
STEP_METRICS = metric_catalogue.prometheus_metrics(EventType.STEP)
EVAL_METRICS = metric_catalogue.prometheus_metrics(EventType.EVAL)
PING_TIMEOUT_S = 0.5


def _gauge(name: str) -> GaugeMetricFamily:
    series = metric_catalogue.fleet_series(name)
    return GaugeMetricFamily(series.name, series.help, labels=list(series.labels))


class FleetCollector(Collector):
    def __init__(
        self,
        db: Database,
        broker_url: str | None = None,
        queues: tuple[str, ...] = ("training",),
        stale_after_s: float = 60.0,
    ) -> None:
        self.db, self.broker_url, self.queues = db, broker_url, queues
        self.stale_after_s = stale_after_s  # the registry's: a worker silent this long is not live
        self._depth = queue_depth_reader(broker_url, timeout_s=1.0)
        self._celery: Any = None

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
        failed = _gauge("stare_failed_jobs")
        orphans = _gauge("stare_jobs_without_worker")
        try:
            with self.db.sessions() as session:
                now = db_now(session)  # heartbeats are the database's time: their age is measured on it
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
                evals = latest_evals(session, [row.id for row in rows])
                failures = failed_job_counts(session)
                without_worker = jobs_without_worker(session, self.stale_after_s)
        except Exception:
            logger.warning("fleet scrape could not read the database", exc_info=True)
            up.add_metric([], 0)
            yield up
            return
        owners: dict[str, set[str]] = {}
        for row in rows:
            labels = [row.id, row.algorithm, row.queue]
            metrics = {**(row.last_metrics or {}), **evals.get(row.id, {})}
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
        queues = sorted(set(self.queues) | set(owners))
        for queue in queues:
            busy.add_metric([queue], float(len(owners.get(queue, ()))))
        counts = {(code, queue): count for code, queue, count in failures}
        for code, queue in sorted(set(counts) | {(c, q) for c in JOB_FAILURE_CODES for q in self.queues}):
            failed.add_metric([code, queue], float(counts.get((code, queue), 0)))
        for queue in sorted(set(self.queues) | set(without_worker)):
            orphans.add_metric([queue], float(without_worker.get(queue, 0)))
        yield from families.values()
        yield orphans
        yield step
        yield total
        yield heartbeat_age
        yield busy
        yield failed
        consumers = self._consumers()
        if consumers is not None:
            workers, idle = _gauge("stare_workers"), _gauge("stare_workers_idle")
            for queue in sorted(set(queues) | set(consumers)):
                waiting = consumers.get(queue, 0)
                idle.add_metric([queue], float(waiting))
                workers.add_metric([queue], float(waiting + len(owners.get(queue, ()))))
            yield workers
            yield idle
        for queue, count in self._queue_depths():
            depth.add_metric([queue], float(count))
        yield depth
        up.add_metric([], 1)
        yield up

    def _consumers(self) -> dict[str, int] | None:
        """queue → workers consuming it that answered a Celery ping within PING_TIMEOUT_S; None when the
        broker is not Redis (the embedded stack) or cannot be reached. A worker runs its job in Celery's
        solo pool (python -m worker run), so it answers only while it runs none: these are the idle ones."""
        if not (self.broker_url or "").startswith(REDIS_SCHEMES):
            return None
        try:
            if self._celery is None:
                import celery

                self._celery = celery.Celery("stare-exporter", broker=self.broker_url, set_as_current=False)
            replies = self._celery.control.inspect(timeout=PING_TIMEOUT_S).active_queues() or {}
        except Exception:
            logger.warning("could not ping the workers", exc_info=True)
            return None
        found: dict[str, int] = {}
        for queues in replies.values():
            for queue in {str(q.get("name")) for q in queues or () if isinstance(q, dict)}:
                found[queue] = found.get(queue, 0) + 1
        return found

    def _queue_depths(self) -> list[tuple[str, int]]:
        """(queue, messages waiting) for the queues whose depth can be read (a Redis broker)."""
        depths = [(queue, self._depth(queue)) for queue in self.queues]
        return [(queue, count) for queue, count in depths if count is not None]
