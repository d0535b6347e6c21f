"""The dashboards and alert rules, statically: the committed JSON is what monitoring/ generates; panel ids
and refIds are unique; every panel reads the datasource variable; no placeholder is left; every series a
query reads is catalogued (the catalogue, FLEET_SERIES, API_SERIES; DCGM-exporter's names only in the GPU
panels), every exported metric has a panel, and every alert rule has promtool cases. The recorded query
results (deploy/grafana/query-results.json) cover exactly the queries the live test runs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from contract import metrics as catalogue
from monitoring import __main__ as cli
from monitoring.alerts import alert_rules
from monitoring.build import DATASOURCE, query_refs, rendered
from monitoring.dashboards import DASHBOARDS, DCGM_SERIES
from monitoring.docs import RESULTS_PATH, load_results
from monitoring.model import DATASOURCE_VAR, Expect
from monitoring.promql import metric_names, selectors, substitute, variables

ROOT = Path(__file__).resolve().parents[2]
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}
KNOWN = (
    {m.prometheus for m in catalogue.CATALOGUE if m.prometheus}
    | {name for s in catalogue.FLEET_SERIES for name in catalogue.series_names(s)}
    | {name for s in catalogue.API_SERIES for name in catalogue.series_names(s)}
)


def _committed() -> dict[str, dict[str, Any]]:
    folder = cli.DASHBOARD_DIR
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))}


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for value in node.values() for s in _strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in _strings(value)]
    return []


def test_the_committed_json_is_what_the_source_generates(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.stale() == [], "run `python -m monitoring --write`"
    assert cli.main(["--check"]) == 0
    assert (
        set(_committed()) == set(rendered()) == {"stare-job.json", "stare-fleet.json", "stare-compare.json"}
    )


def test_check_fails_on_a_stale_or_stray_file(tmp_path: Path) -> None:
    for name, text in rendered().items():
        (tmp_path / name).write_text(text)
    assert cli.stale(tmp_path) == []
    (tmp_path / "stare-job.json").write_text(rendered()["stare-job.json"].replace("Gate on/off", "Gate"))
    (tmp_path / "old.json").write_text("{}")
    assert cli.stale(tmp_path) == ["stare-job.json", "old.json"]


@pytest.mark.parametrize("name", sorted(rendered()))
def test_panel_ids_ref_ids_datasource_and_placeholders(name: str) -> None:
    dashboard = _committed()[name]
    assert dashboard["uid"] and dashboard["title"] and not dashboard.get("__inputs")
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids), ids
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    datasource = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert [v["name"] for v in datasource] == [DATASOURCE_VAR] and datasource[0]["query"] == "prometheus"
    data_panels = [p for p in panels if p["type"] != "row"]
    assert data_panels
    for panel in data_panels:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), (panel["title"], refs)
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, (panel["title"], target["refId"])
            assert target["expr"].strip(), (panel["title"], target["refId"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]
    # No placeholder left: every $variable is defined (or Grafana's own), no ${DS_...} import input, no
    # Python formatting or grafanalib default left in a query or a title.
    for text in _strings(dashboard):
        for var in variables(text):
            assert var in defined or var in GRAFANA_BUILTINS, (name, var, text)
        assert "DS_" not in text and "{}" not in text and "%s" not in text, (name, text)
    for panel in data_panels:
        assert panel["title"] and panel["title"] != "None"
        for target in panel["targets"]:
            assert not re.search(r"\{\{(?!\s*\w+\s*\}\})", target["legendFormat"]), target["legendFormat"]


def test_every_series_the_dashboards_read_is_catalogued() -> None:
    for dashboard in DASHBOARDS:
        for ref in query_refs(dashboard):
            names = metric_names(ref.query.expr)
            assert names, ref.key
            if ref.query.expect is Expect.STATIC:  # the GPU panels: DCGM-exporter's own names
                assert names <= set(DCGM_SERIES) and ref.row.requires == "gpu", ref.key
            else:
                assert names <= KNOWN, (ref.key, sorted(names - KNOWN))
    # DCGM-exporter's default counters include these (GPU utilisation %, frame buffer used/free MiB).
    assert set(DCGM_SERIES) == {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"}


def test_every_exported_series_has_a_panel_and_grafana_is_shown_exactly_where() -> None:
    used = {n for d in DASHBOARDS for ref in query_refs(d) for n in metric_names(ref.query.expr)}
    for metric in catalogue.CATALOGUE:
        on_panel = metric.prometheus in used
        assert on_panel == (catalogue.Surface.GRAFANA in metric.shown), metric.key
        assert on_panel == (metric.prometheus is not None), metric.key
    for series in (*catalogue.FLEET_SERIES, *catalogue.API_SERIES):
        assert used & set(catalogue.series_names(series)), f"{series.name} is on no panel"


def test_the_job_dashboard_has_the_issue_panels_and_variables() -> None:
    job, fleet, compare = DASHBOARDS
    assert [v.name for v in job.variables] == ["algorithm", "job_id"] and not job.variables[1].multi
    assert [r.title for r in job.rows][-2:] == ["Tool use", "Grader"]
    assert job.rows[-2].requires == "tool-use" and job.rows[-1].requires == "a grader"
    compare_ids = [v for v in compare.variables if v.name == "job_id"]
    assert compare_ids and compare_ids[0].multi  # the comparison: several jobs on shared axes
    titles = {p.title for _, p in fleet.panels()}
    assert {"Queue depth", "Workers busy and idle", "Jobs by state", "Failures by code"} <= titles
    assert {"GPU utilisation", "GPU memory", "Latency p95 by route", "Request rate by route"} <= titles


def test_substitution_leaves_no_variable_and_refuses_an_unknown_one() -> None:
    values = {"job_id": "j1", "algorithm": "stare", "queue": "q", "__rate_interval": "1m"}
    for dashboard in DASHBOARDS:
        for ref in query_refs(dashboard):
            assert not variables(substitute(ref.query.expr, values)), ref.key
    with pytest.raises(KeyError, match=r"\$nope"):
        substitute('x{a="$nope"}', values)


def test_selectors_are_found_in_every_form_the_rules_use() -> None:
    assert selectors('sum by (queue) (a{q="1"}) > 0 and on (queue) b') == ['a{q="1"}', "b"]
    assert selectors("min_over_time(g[15m]) == 1 and (s - s offset 15m) >= 50") == ["g", "s", "s"]
    assert selectors("histogram_quantile(0.95, sum by (route, le) (rate(h_bucket[$__rate_interval])))") == [
        "h_bucket"
    ]


def test_every_alert_rule_reads_catalogued_series_and_has_promtool_cases() -> None:
    rules = alert_rules()
    names = [r.name for r in rules]
    assert len(names) == len(set(names))
    for new in (
        "StareGateNotCoping",
        "JobFailed",
        "JobLossNotFinite",
        "PolicyEntropyFarAboveBand",
        "NoLearningSignal",
        "JobsWithoutWorker",
    ):
        assert new in names
    tests = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts_test.yml").read_text())
    tested = {case["alertname"] for t in tests["tests"] for case in t.get("alert_rule_test", [])}
    firing = {
        case["alertname"]
        for t in tests["tests"]
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    for rule in rules:
        assert rule.selectors and metric_names(rule.expr) <= KNOWN, (
            rule.name,
            metric_names(rule.expr) - KNOWN,
        )
        assert rule.severity in {"info", "warning", "critical"}, rule.name
    assert set(names) - tested == set(), "rules without promtool cases"
    new_rules = {
        "StareGateNotCoping",
        "JobFailed",
        "JobLossNotFinite",
        "PolicyEntropyFarAboveBand",
        "NoLearningSignal",
        "JobsWithoutWorker",
    }
    assert new_rules <= firing, "each new rule has a case where it fires"


def test_the_recorded_results_cover_exactly_the_live_queries() -> None:
    """deploy/grafana/query-results.json (STARE_RECORD_QUERY_RESULTS=1): a record for every query the live
    test runs and for every alert selector, none for a query that is gone, and every value finite."""
    assert RESULTS_PATH.is_file()
    recorded = load_results()["results"]
    live = {
        ref.key: ref for d in DASHBOARDS for ref in query_refs(d) if ref.query.expect is not Expect.STATIC
    }
    alerts = {rule.selector_key(i): sel for rule in alert_rules() for i, sel in enumerate(rule.selectors)}
    assert set(recorded) == set(live) | set(alerts), sorted(set(recorded) ^ (set(live) | set(alerts)))
    for key, entry in recorded.items():
        expected = live[key].query.expr if key in live else alerts[key]
        assert entry["expr"] == expected, f"{key} was recorded for another query: run the live test again"
        assert entry["series"], key
        for series in entry["series"]:
            value = float(series["value"])
            assert value == value and abs(value) != float("inf"), key
            if key in live:
                assert live[key].query.expect.admits(value, step=int(value)), (key, value)
