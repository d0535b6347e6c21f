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

import dataclasses
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
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


@dataclasses.dataclass(frozen=True)
class FleetScrape:
    """What one scrape read from the database."""

    now: datetime  # the database's clock
    jobs: list[
        Any
    ]  # the active jobs' rows (id, algorithm, queue, steps, heartbeat, last metrics, lease owner)
    evals: dict[str, dict[str, Any]]  # job id -> its latest evaluation's metrics
    failures: list[tuple[str, str, int]]  # (error code, queue, count) of the failed jobs
    without_worker: dict[str, int]  # queue -> jobs waiting in it that no live worker serves


def _job_gauges(scrape: FleetScrape) -> tuple[list[GaugeMetricFamily], list[GaugeMetricFamily]]:
    """(the catalogue's series, [step, total steps, heartbeat age]) of the active jobs, each labelled
    job_id, algorithm and queue; a metric a job has not reported (or not finite) has no sample."""
    families = {
        metric.key: GaugeMetricFamily(metric.prometheus, metric.series_help, labels=JOB_LABELS)
        for metric in JOB_METRICS
        if metric.prometheus is not None
    }
    step = _gauge("stare_job_step")
    total = _gauge("stare_job_total_steps")
    heartbeat_age = _gauge("stare_job_heartbeat_age_seconds")
    for row in scrape.jobs:
        labels = [row.id, row.algorithm, row.queue]
        metrics = {**(row.last_metrics or {}), **scrape.evals.get(row.id, {})}
        for key, family in families.items():
            value = finite(metrics.get(key))
            if value is not None:
                family.add_metric(labels, value)
        step.add_metric(labels, float(row.current_step or 0))
        total.add_metric(labels, float(row.total_steps))
        if row.heartbeat_at is not None:
            beat = row.heartbeat_at if row.heartbeat_at.tzinfo else row.heartbeat_at.replace(tzinfo=UTC)
            heartbeat_age.add_metric(labels, max(0.0, (scrape.now - beat).total_seconds()))
    return list(families.values()), [step, total, heartbeat_age]


def _lease_owners(jobs: list[Any]) -> dict[str, set[str]]:
    """queue -> the workers holding a lease on one of its active jobs (the busy ones)."""
    owners: dict[str, set[str]] = {}
    for row in jobs:
        owners.setdefault(row.queue, set()).add(row.lease_owner or "")
    return owners


def _busy_workers(queues: list[str], owners: dict[str, set[str]]) -> GaugeMetricFamily:
    busy = _gauge("stare_workers_busy")
    for queue in queues:
        busy.add_metric([queue], float(len(owners.get(queue, ()))))
    return busy


def _scrape_ok(ok: int) -> GaugeMetricFamily:
    up = _gauge("stare_fleet_scrape_ok")
    up.add_metric([], ok)
    return up


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
        try:
            scrape = self._read_database()
        except Exception:
            logger.warning("fleet scrape could not read the database", exc_info=True)
            yield _scrape_ok(0)
            return
        families, per_job = _job_gauges(scrape)
        owners = _lease_owners(scrape.jobs)
        queues = sorted(set(self.queues) | set(owners))
        yield from families
        yield self._jobs_without_worker(scrape.without_worker)
        yield from per_job
        yield _busy_workers(queues, owners)
        yield self._failed_jobs(scrape.failures)
        yield from self._worker_gauges(queues, owners)
        yield self._queue_messages()
        yield _scrape_ok(1)

    def _read_database(self) -> FleetScrape:
        """One scrape's read: the active jobs, their latest evaluations, the failed jobs' codes and the
        jobs no live worker serves, with the database's time (heartbeats' ages are measured on it)."""
        with self.db.sessions() as session:
            now = db_now(session)
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
            return FleetScrape(
                now=now,
                jobs=list(rows),
                evals=latest_evals(session, [row.id for row in rows]),
                failures=failed_job_counts(session),
                without_worker=jobs_without_worker(session, self.stale_after_s),
            )

    def _jobs_without_worker(self, without_worker: dict[str, int]) -> GaugeMetricFamily:
        orphans = _gauge("stare_jobs_without_worker")
        for queue in sorted(set(self.queues) | set(without_worker)):
            orphans.add_metric([queue], float(without_worker.get(queue, 0)))
        return orphans

    def _failed_jobs(self, failures: list[tuple[str, str, int]]) -> GaugeMetricFamily:
        """Failed jobs by error code and queue; every code of JOB_FAILURE_CODES has a series, 0 included."""
        failed = _gauge("stare_failed_jobs")
        counts = {(code, queue): count for code, queue, count in failures}
        for code, queue in sorted(set(counts) | {(c, q) for c in JOB_FAILURE_CODES for q in self.queues}):
            failed.add_metric([code, queue], float(counts.get((code, queue), 0)))
        return failed

    def _worker_gauges(self, queues: list[str], owners: dict[str, set[str]]) -> list[GaugeMetricFamily]:
        """The workers and the idle workers of each queue (the idle answer a ping, the busy hold a lease);
        none when the workers cannot be pinged (`_consumers`)."""
        consumers = self._consumers()
        if consumers is None:
            return []
        workers, idle = _gauge("stare_workers"), _gauge("stare_workers_idle")
        for queue in sorted(set(queues) | set(consumers)):
            waiting = consumers.get(queue, 0)
            idle.add_metric([queue], float(waiting))
            workers.add_metric([queue], float(waiting + len(owners.get(queue, ()))))
        return [workers, idle]

    def _queue_messages(self) -> GaugeMetricFamily:
        depth = _gauge("stare_queue_messages")
        for queue, count in self._queue_depths():
            depth.add_metric([queue], float(count))
        return depth

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
