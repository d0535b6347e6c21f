"""The alert rules (deploy/prometheus/alerts.yml), read for the checks and the docs: each rule's
expression and the vector selectors it reads (monitoring.promql.selectors)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from monitoring.promql import selectors

ALERTS_PATH = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "alerts.yml"


@dataclass(frozen=True)
class AlertRule:
    group: str
    name: str
    expr: str
    severity: str

    @property
    def selectors(self) -> list[str]:
        """Its distinct vector selectors, in order of first use."""
        return list(dict.fromkeys(selectors(self.expr)))

    def selector_key(self, index: int) -> str:
        return f"alert/{self.name}/{index}"


def alert_rules(path: Path = ALERTS_PATH) -> list[AlertRule]:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    rules = []
    for group in document["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                expr = " ".join(str(rule["expr"]).split())
                rules.append(
                    AlertRule(group["name"], rule["alert"], expr, rule.get("labels", {}).get("severity", ""))
                )
    return rules
