"""The series the exporter and the API publish that are not trainer metrics: the fleet's (from the job rows,
the workers' leases and the broker) and the API process's own (service/telemetry.py)."""

from __future__ import annotations

from contract.metrics_types import JOB_LABELS, FleetSeries, PrometheusType

FLEET_SERIES: tuple[FleetSeries, ...] = (
    FleetSeries("stare_job_step", "Last completed step.", JOB_LABELS),
    FleetSeries("stare_job_total_steps", "Steps the job will run.", JOB_LABELS),
    FleetSeries(
        "stare_job_heartbeat_age_seconds",
        "Seconds since the job's worker last renewed its lease.",
        JOB_LABELS,
    ),
    FleetSeries("stare_workers_busy", "Workers holding a job lease, by queue.", ("queue",)),
    FleetSeries(
        "stare_workers",
        "Workers of the queue: the busy ones plus the idle ones (Redis broker only).",
        ("queue",),
    ),
    FleetSeries(
        "stare_workers_idle",
        "Workers consuming the queue and running no job: those that answer a Celery ping (Redis broker only).",
        ("queue",),
    ),
    FleetSeries(
        "stare_failed_jobs",
        "Jobs that ended failed, by the error code the worker or sweeper recorded (every known code, 0 too).",
        ("code", "queue"),
    ),
    FleetSeries("stare_queue_messages", "Messages waiting on the broker, by queue.", ("queue",)),
    FleetSeries(
        "stare_jobs_without_worker",
        "Jobs waiting (queued, recovering) in a queue that no live worker serves: no worker of the queue has "
        "beaten within STARE_WORKER_STALE_AFTER_S, so nothing will take them (the training queue, 0 too).",
        ("queue",),
    ),
    FleetSeries("stare_fleet_scrape_ok", "1 when the last scrape read the database.", ()),
)


# The API process's series (service/telemetry.py), as Prometheus exposes them (a counter gains `_total`, a
# histogram `_bucket`, `_sum` and `_count`).
API_SERIES: tuple[FleetSeries, ...] = (
    FleetSeries(
        "stare_http_requests_total",
        "HTTP requests served.",
        ("route", "method", "status_class"),
        PrometheusType.COUNTER,
    ),
    FleetSeries(
        "stare_http_request_duration_seconds",
        "Time to the end of the response.",
        ("route", "method"),
        PrometheusType.HISTOGRAM,
    ),
    FleetSeries(
        "stare_enqueue_failures_total",
        "Jobs committed whose doorbell could not be sent.",
        (),
        PrometheusType.COUNTER,
    ),
    FleetSeries("stare_jobs", "Jobs by status and queue.", ("status", "queue")),
    FleetSeries("stare_database_up", "1 when the last scrape could read the database.", ()),
)


def series_names(series: FleetSeries) -> tuple[str, ...]:
    """The sample names a series is exposed under: a histogram's _bucket, _sum and _count."""
    if series.type is PrometheusType.HISTOGRAM:
        return tuple(f"{series.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
    return (series.name,)
