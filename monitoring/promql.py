"""Just enough PromQL reading for the checks: the vector selectors of an expression (metric name and label
matchers, without range or offset), the metric names it reads, and Grafana's variables substituted.

The rule the integration test applies to an alert rule (which is written to fire only under conditions):
each vector selector of its expression, as an instant query, must return series for the test's job (or
queue). `selectors()` is how those are found; docs/MONITORING.md states the rule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Tokens: strings, label matchers, range/subquery brackets, numbers and durations, names, anything else.
_TOKEN = re.compile(
    r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|\{[^}]*\}|\[[^\]]*\]|\d+(?:\.\d+)?(?:ms|[smhdwy])?'
    r"|[a-zA-Z_:][a-zA-Z0-9_:]*|\s+|."
)
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
# Aggregation operators can be followed by a `by (...)` clause rather than their parenthesis.
_KEYWORDS |= {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile"}
_KEYWORDS |= {"count_values", "limitk", "limit_ratio"}
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _tokens(expr: str) -> list[str]:
    return [t for t in _TOKEN.findall(expr) if not t.isspace()]


def selectors(expr: str) -> list[str]:
    """The vector selectors of `expr`, e.g. `rate(a{x="1"}[5m]) > b offset 1h` → ['a{x="1"}', 'b']."""
    tokens = _tokens(expr)
    out: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token in _LABEL_LISTS and following == "(":
            i = tokens.index(")", i) + 1  # a label list: names, not metrics
            continue
        if re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", token) and token not in _KEYWORDS and following != "(":
            if following.startswith("{"):
                out.append(token + following)
                i += 2
                continue
            out.append(token)
        i += 1
    return out


def metric_names(expr: str) -> set[str]:
    return {re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", s).group(0) for s in selectors(expr)}  # type: ignore[union-attr]


def variables(text: str) -> set[str]:
    return {a or b for a, b in VARIABLE.findall(text)}


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Grafana's variables replaced by `values`; KeyError names a variable that has no value."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return VARIABLE.sub(one, expr)
