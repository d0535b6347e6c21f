"""The metric catalogue: every metric key the trainer emits, with its unit, meaning, Prometheus name and
where it is shown. The exporter (worker/metrics.py), the job view (service/views.py), the report, the
Grafana dashboards (monitoring/) and docs/metrics.md read it; `python -m monitoring.docs --write` regenerates
docs/metrics.md (render_markdown here is its catalogue part) and a test fails when the committed file differs.

Also here: the entropy band's state values (-1 below, 0 inside, 1 above), the fleet series the exporter
derives from the job rows, leases and broker rather than from the trainer's metrics, and the API's series
(service/telemetry.py). Standard library only.

The catalogue is written in parts, by concern (all re-exported here, the module every reader imports):
contract/metrics_types.py (the shapes), metrics_training.py (what every step logs), metrics_methods.py (what
the methods and the runtime log), metrics_catalogue.py (the two in order), metrics_series.py (the fleet's and the API's series) and metrics_docs.py
(docs/metrics.md's catalogue part).
"""

from __future__ import annotations

from contract.docs import DOCS
from contract.metrics_catalogue import CATALOGUE, catalogue
from contract.metrics_docs import render_markdown
from contract.metrics_series import API_SERIES, FLEET_SERIES, series_names
from contract.metrics_types import JOB_LABELS, BandState, FleetSeries, Metric, PrometheusType, Surface
from contract.protocol import EventType

__all__ = [
    "API_SERIES",
    "BAND_HIGH",
    "BAND_LOW",
    "BAND_STATE",
    "CATALOGUE",
    "COLLAPSE_STEP",
    "DOCS_PATH",
    "ENTROPY",
    "FLEET_SERIES",
    "JOB_LABELS",
    "METRICS",
    "POST_GATE_STEPS",
    "STEPS_OUT_OF_BAND",
    "STEP_SECONDS",
    "TARGET_ENTROPY",
    "TARGET_HOLD_FRACTION",
    "BandState",
    "FleetSeries",
    "Metric",
    "PrometheusType",
    "Surface",
    "catalogue",
    "fleet_series",
    "get",
    "prometheus_metrics",
    "render_markdown",
    "series_names",
]

DOCS_PATH = DOCS / "metrics.md"


def _index() -> dict[str, Metric]:
    by_key: dict[str, Metric] = {}
    names: set[str] = {series.name for series in (*FLEET_SERIES, *API_SERIES)}
    for metric in CATALOGUE:
        if metric.key in by_key:
            raise ValueError(f"metric {metric.key!r} is catalogued twice")
        by_key[metric.key] = metric
        if metric.prometheus is not None:
            if metric.prometheus in names:
                raise ValueError(f"Prometheus name {metric.prometheus!r} is used twice")
            names.add(metric.prometheus)
    return by_key


METRICS: dict[str, Metric] = _index()  # checked at import: keys and Prometheus names are unique


def get(key: str) -> Metric:
    try:
        return METRICS[key]
    except KeyError:
        raise ValueError(f"unknown metric {key!r} (not in contract.metrics.CATALOGUE)") from None


def prometheus_metrics(event: EventType | None = None) -> list[Metric]:
    """The metrics the exporter publishes, in catalogue order (of one event type when given: step metrics
    come from the job's latest step, eval metrics from its latest evaluation)."""
    return [m for m in CATALOGUE if m.prometheus is not None and (event is None or m.event is event)]


def fleet_series(name: str) -> FleetSeries:
    for series in FLEET_SERIES:
        if series.name == name:
            return series
    raise ValueError(f"unknown fleet series {name!r}; valid: {', '.join(s.name for s in FLEET_SERIES)}")


# Keys the job view and the report read by name.
ENTROPY = get("entropy/mean").key
BAND_LOW = get("entropy/band_low").key
BAND_HIGH = get("entropy/band_high").key
BAND_STATE = get("entropy/band_state").key
STEPS_OUT_OF_BAND = get("entropy/steps_out_of_band").key
COLLAPSE_STEP = get("entropy/collapse_step").key
TARGET_HOLD_FRACTION = get("entropy/target_hold_fraction").key
POST_GATE_STEPS = get("entropy/post_gate_steps").key
TARGET_ENTROPY = get("entropy/target").key
STEP_SECONDS = get("perf/step_seconds").key
