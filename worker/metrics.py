"""Prometheus exposition of the training fleet: the latest per-step values of active jobs, and queue and
worker gauges.

The collector keeps no state: at each scrape it reads the active jobs (running, pausing, cancelling) and
their latest metric snapshot from the database, and the queue depth from the broker. A finished job is no
longer active, so its series vanish from the next scrape. Labels are job_id, algorithm and queue only
(never step, tenant or prompt: bounded cardinality).

Run it with `python -m worker exporter --port 9464`; the catalogue below is the documented list.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from service.database import Database
from service.models import LEASED_STATUSES, Job
from worker.broker import queue_depth_reader

logger = logging.getLogger(__name__)

JOB_LABELS = ["job_id", "algorithm", "queue"]

# trainer metric key → (Prometheus name, help)
JOB_METRICS: dict[str, tuple[str, str]] = {
    "entropy/mean": ("stare_job_entropy_nats", "Token-mean policy entropy of the last step (π_old, nats)."),
    "entropy/band_low": ("stare_job_entropy_band_low_nats", "Lower edge of the job's entropy band."),
    "entropy/band_high": ("stare_job_entropy_band_high_nats", "Upper edge of the job's entropy band."),
    "entropy/band_state": ("stare_job_entropy_band_state", "-1 below the band, 0 inside, 1 above."),
    "entropy/steps_out_of_band": (
        "stare_job_entropy_steps_out_of_band",
        "Consecutive steps outside the band.",
    ),
    "stare/gate_on": ("stare_job_gate_on", "STARE target-entropy gate (1 on, 0 off)."),
    "stare/reweight_w": ("stare_job_reweight_w", "STARE weight W on high-surprisal positive tokens."),
    "stare/reweight_m": ("stare_job_reweight_m", "STARE weight M on high-surprisal negative tokens (C2)."),
    "stare/target_entropy": ("stare_job_target_entropy_nats", "STARE target entropy."),
    "stare/mean_weight": ("stare_job_mean_weight", "Mean STARE token weight over active tokens."),
    "quadrant/pos_low_fraction": ("stare_job_quadrant_pos_low_fraction", "Token share with Â>0 and s<H."),
    "quadrant/pos_high_fraction": ("stare_job_quadrant_pos_high_fraction", "Token share with Â>0 and s>H."),
    "quadrant/neg_low_fraction": ("stare_job_quadrant_neg_low_fraction", "Token share with Â<0 and s<H."),
    "quadrant/neg_high_fraction": ("stare_job_quadrant_neg_high_fraction", "Token share with Â<0 and s>H."),
    "quadrant/pos_low_drift": ("stare_job_quadrant_pos_low_drift", "Predicted entropy drift from Â>0, s<H."),
    "quadrant/pos_high_drift": (
        "stare_job_quadrant_pos_high_drift",
        "Predicted entropy drift from Â>0, s>H.",
    ),
    "quadrant/neg_low_drift": ("stare_job_quadrant_neg_low_drift", "Predicted entropy drift from Â<0, s<H."),
    "quadrant/neg_high_drift": (
        "stare_job_quadrant_neg_high_drift",
        "Predicted entropy drift from Â<0, s>H.",
    ),
    "quadrant/predicted_drift": ("stare_job_predicted_entropy_drift", "Total first-order entropy drift."),
    "reward/mean": ("stare_job_reward_mean", "Mean shaped reward of the step's responses."),
    "reward/accuracy": ("stare_job_accuracy", "Verifier accuracy of the step's responses."),
    "reward/zero_std_fraction": (
        "stare_job_zero_variance_group_fraction",
        "Groups whose rewards are all equal.",
    ),
    "response/length_mean": ("stare_job_response_length_tokens", "Mean response length."),
    "response/reflection_rate": ("stare_job_reflection_rate", "Reflection phrases per response."),
    "clip/fraction": ("stare_job_clip_fraction", "Share of tokens whose ratio was clipped."),
    "clip/dual_fraction": ("stare_job_dual_clip_fraction", "Share of tokens under the dual clip."),
    "kl/approx_old": ("stare_job_approx_kl", "Approximate KL to the behaviour policy."),
    "perf/tokens_per_second": ("stare_job_tokens_per_second", "Tokens processed per second in the step."),
    "perf/step_seconds": ("stare_job_step_seconds", "Wall time of the last step."),
}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


class FleetCollector(Collector):
    def __init__(
        self, db: Database, broker_url: str | None = None, queues: tuple[str, ...] = ("training",)
    ) -> None:
        self.db, self.broker_url, self.queues = db, broker_url, queues
        self._depth = queue_depth_reader(broker_url, timeout_s=1.0)

    def collect(self) -> Iterator[Metric]:
        families = {
            key: GaugeMetricFamily(name, doc, labels=JOB_LABELS) for key, (name, doc) in JOB_METRICS.items()
        }
        step = GaugeMetricFamily("stare_job_step", "Last completed step.", labels=JOB_LABELS)
        total = GaugeMetricFamily("stare_job_total_steps", "Steps the job will run.", labels=JOB_LABELS)
        heartbeat_age = GaugeMetricFamily(
            "stare_job_heartbeat_age_seconds",
            "Seconds since the job's worker last renewed its lease.",
            labels=JOB_LABELS,
        )
        busy = GaugeMetricFamily(
            "stare_workers_busy", "Workers holding a job lease, by queue.", labels=["queue"]
        )
        depth = GaugeMetricFamily(
            "stare_queue_messages", "Messages waiting on the broker, by queue.", labels=["queue"]
        )
        up = GaugeMetricFamily("stare_fleet_scrape_ok", "1 when the last scrape read the database.")
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
                value = _finite(metrics.get(key))
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
