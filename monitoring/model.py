"""What a dashboard is made of, before grafanalib turns it into Grafana's JSON: panels of PromQL queries,
each with the values it must return in the integration test (`Expect`), and the template variables."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

DATASOURCE_VAR = "datasource"
DATASOURCE_UID = "stare-prometheus"  # the provisioned datasource's fixed uid (deploy/grafana/provisioning)
RATE_INTERVAL = "$__rate_interval"  # Grafana's own variable: at least four scrape intervals


class Expect(StrEnum):
    """What every value a query returns must be, for a live job (tests/monitoring checks it)."""

    FINITE = "finite"
    NONNEGATIVE = "≥ 0"
    POSITIVE = "> 0"
    FRACTION = "in [0, 1]"
    FLAG = "0 or 1"
    STATE = "-1, 0 or 1"
    COUNT = "a whole number ≥ 0"
    STEP = "the job's step"
    ZERO = "0"
    STATIC = "not run: DCGM-exporter's series (no GPU here); names checked statically"

    def admits(self, value: float, step: int | None = None) -> bool:
        if self is Expect.STATIC:
            return False
        if not math.isfinite(value):
            return False
        if self is Expect.NONNEGATIVE:
            return value >= 0
        if self is Expect.POSITIVE:
            return value > 0
        if self is Expect.FRACTION:
            return 0 <= value <= 1
        if self is Expect.FLAG:
            return value in (0, 1)
        if self is Expect.STATE:
            return value in (-1, 0, 1)
        if self is Expect.COUNT:
            return value >= 0 and value == int(value)
        if self is Expect.STEP:
            return step is not None and value == step
        if self is Expect.ZERO:
            return value == 0
        return True


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str
    expect: Expect


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"  # or "stat"
    width: int = 8


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]
    # A row whose series exist only for some jobs (the tool-use row: jobs with a tool environment); the
    # integration test runs it against such a job.
    requires: str | None = None


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    query: str  # a Prometheus label_values(...) query
    multi: bool = False
    include_all: bool = False


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    variables: tuple[Variable, ...]
    rows: tuple[Row, ...]
    tags: tuple[str, ...] = ("stare",)
    time_from: str = "now-1h"

    @property
    def filename(self) -> str:
        return f"{self.uid}.json"

    def panels(self) -> list[tuple[Row, Panel]]:
        return [(row, panel) for row in self.rows for panel in row.panels]


@dataclass(frozen=True)
class QueryRef:
    """One query of one panel, as the test and the docs address it."""

    dashboard: Dashboard
    row: Row
    panel: Panel
    ref_id: str
    query: Query

    @property
    def key(self) -> str:
        return f"{self.dashboard.uid}/{self.panel.title}/{self.ref_id}"


def ref_ids(count: int) -> Sequence[str]:
    """A, B, C, ... (Grafana's refIds)."""
    if count > 26:
        raise ValueError("a panel has at most 26 queries")
    return [chr(ord("A") + i) for i in range(count)]
