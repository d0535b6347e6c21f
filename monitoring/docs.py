"""docs/metrics.md: the metric catalogue (contract.metrics.render_markdown) with the panels that show each
series, then, per dashboard, every panel's queries and the values they returned in the integration test
(deploy/grafana/query-results.json, written by tests/monitoring/test_live_queries.py when run with
STARE_RECORD_QUERY_RESULTS=1), and the alert rules' selectors likewise.

`python -m monitoring.docs [--write]` prints or writes it; tests/contract/test_metrics.py fails when the
committed file differs from what the committed sources generate.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from contract import metrics as catalogue
from contract.docs import DOCS, generated_doc_main
from monitoring.alerts import alert_rules
from monitoring.build import query_refs
from monitoring.dashboards import DASHBOARDS
from monitoring.model import Expect
from monitoring.promql import metric_names

DOCS_PATH = DOCS / "metrics.md"
RESULTS_PATH = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "query-results.json"


def panels_by_series() -> dict[str, list[str]]:
    """Prometheus series name → "Dashboard › Panel" for every panel whose queries read it."""
    found: dict[str, list[str]] = {}
    for dashboard in DASHBOARDS:
        for ref in query_refs(dashboard):
            for name in metric_names(ref.query.expr):
                for base in _bases(name):
                    where = f"{dashboard.title} › {ref.panel.title}"
                    if where not in found.setdefault(base, []):
                        found[base].append(where)
    return found


def _bases(name: str) -> list[str]:
    """The catalogued series a sample name belongs to (a histogram's _bucket/_count/_sum)."""
    names = [name]
    for suffix in ("_bucket", "_count", "_sum"):
        if name.endswith(suffix):
            names.append(name.removesuffix(suffix))
    return names


def load_results(path: Path = RESULTS_PATH) -> dict[str, Any]:
    if not path.is_file():
        return {"run": {}, "results": {}}
    return dict(json.loads(path.read_text(encoding="utf-8")))


def _number(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.4g}"


def _returned(entry: Mapping[str, Any] | None) -> str:
    if not entry:
        return "not recorded"
    series = entry.get("series", [])
    if not series:
        return "no series"
    shown = []
    for s in series[:4]:
        label = s.get("label") or ""
        shown.append(f"{label}={_number(float(s['value']))}" if label else _number(float(s["value"])))
    more = f" (+{len(series) - 4} more)" if len(series) > 4 else ""
    return ", ".join(shown) + more


def _code(text: str) -> str:
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def render_dashboards(results: Mapping[str, Any]) -> list[str]:
    values = results.get("results", {})
    run = results.get("run", {})
    lines = [
        "## Dashboards",
        "",
        "Generated into `deploy/grafana/dashboards/` by `python -m monitoring --write` from `monitoring/`",
        "(docs/MONITORING.md). *Returned* is what the query gave in the integration test",
        "(`tests/monitoring/test_live_queries.py`, with the variables set to the test's job and queue), recorded",
        "in `deploy/grafana/query-results.json` by running it with `STARE_RECORD_QUERY_RESULTS=1`; the test",
        "checks every value against *expected* each time it runs. The GPU panels are the one exception: no",
        "DCGM-exporter runs there, so their queries are checked statically (the metric names DCGM-exporter",
        "publishes), never executed.",
        "",
    ]
    if run:
        lines += [
            "Recorded run: " + ", ".join(f"{key} `{run[key]}`" for key in sorted(run)) + ".",
            "",
        ]
    for dashboard in DASHBOARDS:
        variables = ", ".join(f"`${v.name}`" + (" (multi)" if v.multi else "") for v in dashboard.variables)
        lines += [
            f"### {dashboard.title} (`{dashboard.uid}`)",
            "",
            f"{dashboard.description} File `deploy/grafana/dashboards/{dashboard.filename}`; variables "
            f"`$datasource`{', ' + variables if variables else ''}.",
            "",
            "| row | panel | ref | query | expected | returned |",
            "|---|---|---|---|---|---|",
        ]
        for ref in query_refs(dashboard):
            expected = (
                ref.query.expect.value if ref.query.expect is not Expect.STATIC else "static check only"
            )
            returned = (
                "not run (no GPU)" if ref.query.expect is Expect.STATIC else _returned(values.get(ref.key))
            )
            lines.append(
                f"| {ref.row.title} | {ref.panel.title} | {ref.ref_id} | {_code(ref.query.expr)} | {expected} "
                f"| {returned} |"
            )
        lines.append("")
    lines += [
        "## Alert rules",
        "",
        "`deploy/prometheus/alerts.yml` (tested by `promtool test rules deploy/prometheus/alerts_test.yml`).",
        "An alert's expression holds only under its condition, so the integration test evaluates each of its",
        "vector selectors (without range or offset) and requires series for the test's job or queue;",
        "*returned* is the number of series each gave.",
        "",
        "| alert | severity | expression | selector | returned |",
        "|---|---|---|---|---|",
    ]
    for rule in alert_rules():
        for index, selector in enumerate(rule.selectors):
            entry = values.get(rule.selector_key(index))
            count = "not recorded" if entry is None else f"{len(entry.get('series', []))} series"
            expr = _code(rule.expr) if index == 0 else ""
            lines.append(
                f"| {rule.name if index == 0 else ''} | {rule.severity if index == 0 else ''} | {expr} "
                f"| {_code(selector)} | {count} |"
            )
    lines.append("")
    return lines


def render(results: Mapping[str, Any] | None = None) -> str:
    text = catalogue.render_markdown(panels_by_series())
    return text + "\n" + "\n".join(render_dashboards(load_results() if results is None else results))


def main(argv: list[str] | None = None) -> int:
    return generated_doc_main(
        argv, prog="python -m monitoring.docs", path=DOCS_PATH, render=lambda _: render()
    )


if __name__ == "__main__":
    sys.exit(main())
