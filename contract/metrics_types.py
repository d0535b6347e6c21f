"""The shapes of the metric catalogue (contract/metrics.py): where a metric is shown, its Prometheus type, the
entropy band's states, a catalogued metric, a fleet series, and `metric`, the constructor the catalogue's
entries are written with. Standard library only."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum, StrEnum

from contract.numbers import finite
from contract.protocol import EventType


class Surface(StrEnum):
    """Where a metric is shown, beyond the per-step history every step metric has (GET
    /v1/jobs/{id}/metrics, the job's latest_metrics, events.jsonl)."""

    JOB_VIEW = "job view"  # a derived field of the job object (entropy status, ETA)
    REPORT = "report"  # report.json / report.html (trainer/report.py)
    PROMETHEUS = "prometheus"  # the fleet exporter (python -m worker exporter)
    GRAFANA = "grafana"  # a panel of the dashboards (monitoring/ → deploy/grafana/dashboards/)


class PrometheusType(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


class BandState(Enum):
    """Where the step's entropy lies against the entropy band; `entropy/band_state` logs `code`."""

    BELOW = (-1, "below")
    IN_BAND = (0, "in_band")
    ABOVE = (1, "above")

    def __init__(self, code: int, label: str) -> None:
        self.code = code
        self.label = label

    @classmethod
    def of(cls, entropy: float, low: float, high: float) -> BandState:
        """Below when entropy < low, above when entropy > high, else in the band (the edges are inside)."""
        return cls.BELOW if entropy < low else cls.ABOVE if entropy > high else cls.IN_BAND

    @classmethod
    def from_code(cls, value: object) -> BandState:
        """The state a logged `entropy/band_state` stands for: its sign. ValueError for a non-number."""
        number = finite(value)
        if number is None:
            raise ValueError(f"a band state must be a finite number, got {value!r}")
        return {-1: cls.BELOW, 0: cls.IN_BAND, 1: cls.ABOVE}[int(math.copysign(1, number)) if number else 0]

    @classmethod
    def from_label(cls, label: str) -> BandState:
        for state in cls:
            if state.label == label:
                return state
        valid = ", ".join(state.label for state in cls)
        raise ValueError(f"unknown band state {label!r}; valid: {valid}")


@dataclass(frozen=True)
class Metric:
    key: str
    unit: str
    help: str
    event: EventType = EventType.STEP
    applies_to: str = "every algorithm"
    prometheus: str | None = None  # the exporter's series name (labels job_id, algorithm, queue)
    prometheus_type: PrometheusType = PrometheusType.GAUGE
    prometheus_help: str | None = None  # the series' HELP text; default: `help`
    shown: frozenset[Surface] = frozenset()

    def __post_init__(self) -> None:
        if self.event not in (EventType.STEP, EventType.EVAL):
            raise ValueError(f"{self.key}: metrics come with step or eval events, not {self.event!r}")
        if (self.prometheus is not None) != (Surface.PROMETHEUS in self.shown):
            raise ValueError(f"{self.key}: a Prometheus name goes with the prometheus surface")

    @property
    def series_help(self) -> str:
        return self.prometheus_help or self.help


@dataclass(frozen=True)
class FleetSeries:
    """A series the exporter reads from the job rows, the workers' leases or the broker."""

    name: str
    help: str
    labels: tuple[str, ...]
    type: PrometheusType = PrometheusType.GAUGE


JOB_LABELS = ("job_id", "algorithm", "queue")


def metric(
    key: str,
    unit: str,
    help: str,
    *,
    prometheus: str | None = None,
    prometheus_help: str | None = None,
    shown: Iterable[Surface] = (),
    applies_to: str = "every algorithm",
    event: EventType = EventType.STEP,
) -> Metric:
    # Every exported metric has a panel in the dashboards (tests/monitoring checks both directions).
    surfaces = frozenset(shown) | ({Surface.PROMETHEUS, Surface.GRAFANA} if prometheus else set())
    return Metric(
        key,
        unit,
        help,
        event=event,
        applies_to=applies_to,
        prometheus=prometheus,
        prometheus_help=prometheus_help,
        shown=surfaces,
    )
