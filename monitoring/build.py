"""Grafana JSON from the dashboards' data (monitoring/dashboards.py), through grafanalib."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grafanalib.core as g
from grafanalib._gen import DashboardEncoder

from monitoring.dashboards import DASHBOARDS
from monitoring.model import DATASOURCE_UID, DATASOURCE_VAR, Dashboard, Panel, QueryRef, ref_ids

DATASOURCE = {"type": "prometheus", "uid": f"${{{DATASOURCE_VAR}}}"}
PANEL_HEIGHT = 8


def query_refs(dashboard: Dashboard) -> Iterator[QueryRef]:
    """Every query of the dashboard with its panel's refId, in panel order."""
    for row, panel in dashboard.panels():
        for ref_id, query in zip(ref_ids(len(panel.queries)), panel.queries, strict=True):
            yield QueryRef(dashboard, row, panel, ref_id, query)


def _targets(panel: Panel) -> list[g.Target]:
    return [
        g.Target(expr=q.expr, legendFormat=q.legend, refId=ref_id, datasource=DATASOURCE)
        for ref_id, q in zip(ref_ids(len(panel.queries)), panel.queries, strict=True)
    ]


def _panel(panel: Panel, grid: g.GridPos) -> g.Panel:
    if panel.kind == "stat":
        return g.Stat(
            title=panel.title,
            description=panel.description,
            dataSource=DATASOURCE,
            targets=_targets(panel),
            gridPos=grid,
            format=panel.unit,
            reduceCalc="lastNotNull",
            graphMode="none",
        )
    return g.TimeSeries(
        title=panel.title,
        description=panel.description,
        dataSource=DATASOURCE,
        targets=_targets(panel),
        gridPos=grid,
        unit=panel.unit,
        legendDisplayMode="list",
        legendPlacement="bottom",
        tooltipMode="multi",
    )


def _variables(dashboard: Dashboard) -> list[g.Template]:
    variables = [
        g.Template(
            name=DATASOURCE_VAR,
            label="Data source",
            query="prometheus",
            type="datasource",
            default=DATASOURCE_UID,
        )
    ]
    for v in dashboard.variables:
        variables.append(
            g.Template(
                name=v.name,
                label=v.label,
                query=v.query,
                dataSource=DATASOURCE,
                type="query",
                refresh=2,  # on time range change: new jobs appear
                multi=v.multi,
                includeAll=v.include_all,
                allValue=".*" if v.include_all else None,
                sort=1,
            )
        )
    return variables


def build(dashboard: Dashboard) -> g.Dashboard:
    panels: list[g.Panel] = []
    y = 0
    for row in dashboard.rows:
        panels.append(g.RowPanel(title=row.title, gridPos=g.GridPos(h=1, w=24, x=0, y=y)))
        y += 1
        x = 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y = 0, y + PANEL_HEIGHT
            panels.append(_panel(panel, g.GridPos(h=PANEL_HEIGHT, w=panel.width, x=x, y=y)))
            x += panel.width
        y += PANEL_HEIGHT
    return g.Dashboard(
        title=dashboard.title,
        uid=dashboard.uid,
        description=dashboard.description,
        tags=list(dashboard.tags),
        panels=panels,
        templating=g.Templating(list=_variables(dashboard)),
        time=g.Time(dashboard.time_from, "now"),
        refresh="30s",
        timezone="utc",
    ).auto_panel_ids()


def render(dashboard: Dashboard) -> str:
    data: dict[str, Any] = build(dashboard).to_json_data()
    return json.dumps(data, cls=DashboardEncoder, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def rendered() -> dict[str, str]:
    """file name → JSON text, for every dashboard."""
    return {dashboard.filename: render(dashboard) for dashboard in DASHBOARDS}
