"""The catalogue part of docs/metrics.md (`python -m monitoring.docs --write` writes the file)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from contract.metrics_catalogue import CATALOGUE
from contract.metrics_series import API_SERIES, FLEET_SERIES
from contract.metrics_types import JOB_LABELS, BandState, FleetSeries, Surface


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(panels: Mapping[str, Sequence[str]] | None = None) -> str:
    """The catalogue part of docs/metrics.md; `panels` maps a Prometheus series name to the dashboard panels
    that read it (monitoring.docs passes it and appends the dashboards' tables)."""
    panels = panels or {}

    def where(name: str | None) -> str:
        return "; ".join(_cell(p) for p in panels.get(name or "", ()))

    lines = [
        "# Metrics",
        "",
        "Generated from `contract/metrics.py`, the dashboards' source (`monitoring/`) and the values the",
        "integration test recorded (`deploy/grafana/query-results.json`) by `python -m monitoring.docs --write`;",
        "do not edit by hand (tests/contract/test_metrics.py fails when this file and its sources differ).",
        "",
        "Every step metric is in the job's per-step history (`GET /v1/jobs/{id}/metrics`), its",
        "`latest_metrics` and the run's `events.jsonl` (`step` events; `eval/*` come with `eval` events).",
        "*Shown* lists where else a metric is read: the job view's derived fields (entropy status, ETA),",
        "the report (`report.json`, `report.html`), the Prometheus exporter (`python -m worker exporter`,",
        "labels " + ", ".join(f"`{label}`" for label in JOB_LABELS) + ") and the Grafana dashboards",
        "(`deploy/grafana/dashboards/`, generated from `monitoring/`; *panels* names them). An exported eval",
        "metric is the job's latest evaluation. How to run Grafana and Prometheus: docs/MONITORING.md.",
        "",
        "## Trainer metrics",
        "",
        "| key | event | unit | applies to | meaning | Prometheus | shown | panels |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in CATALOGUE:
        prom = f"`{m.prometheus}` ({m.prometheus_type.value})" if m.prometheus else ""
        shown = ", ".join(s.value for s in Surface if s in m.shown)
        lines.append(
            f"| `{m.key}` | {m.event.value} | {_cell(m.unit)} | {_cell(m.applies_to)} | {_cell(m.help)} "
            f"| {prom} | {shown} | {where(m.prometheus)} |"
        )
    lines += [
        "",
        "## Entropy band states",
        "",
        "`entropy/band_state` logs the code; the job view's `entropy.state` and the report use the name.",
        "",
        "| code | name |",
        "|---|---|",
        *(f"| {state.code} | `{state.label}` |" for state in BandState),
        "",
        "## Fleet series",
        "",
        "The exporter's series that come from the job rows, the leases and the broker, not from a metric.",
        "",
        *_series_table(FLEET_SERIES, where),
        "",
        "## API series",
        "",
        "The API process's own series (`GET /metrics` of `python -m service serve`, service/telemetry.py).",
        "",
        *_series_table(API_SERIES, where),
        "",
    ]
    return "\n".join(lines)


def _series_table(series: Iterable[FleetSeries], where: Callable[[str], str]) -> list[str]:
    rows = ["| Prometheus | type | labels | meaning | panels |", "|---|---|---|---|---|"]
    for s in series:
        labels = ", ".join(f"`{label}`" for label in s.labels)
        rows.append(f"| `{s.name}` | {s.type.value} | {labels} | {_cell(s.help)} | {where(s.name)} |")
    return rows
