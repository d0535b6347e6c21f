"""The job page's charts (service/routers/pages.py hands them to its script): the report's charts
(trainer/report/page.py) plus throughput, tool use and a grader's health, each series named, unit and help
included, from the metric catalogue (contract/metrics.py)."""

from __future__ import annotations

from typing import Any

from contract import metrics as catalogue

QUADRANT_LABELS = {  # as the report names them
    "pos_low": "Â>0, low surprisal",
    "pos_high": "Â>0, high surprisal",
    "neg_low": "Â<0, low surprisal",
    "neg_high": "Â<0, high surprisal",
}


def _series(key: str, label: str, **style: Any) -> dict[str, Any]:
    metric = catalogue.get(key)
    return {"key": metric.key, "label": label, "unit": metric.unit, "help": metric.help, **style}


def chart_groups() -> list[dict[str, Any]]:
    """The page's charts, as the report draws them (trainer/report/page.py) plus throughput, tool use and a
    grader's health.
    The page draws a chart only when the job logged at least one of its series."""
    return [*_entropy_charts(), *_response_charts(), *_performance_charts(), _tool_chart(), _grader_chart()]


def _entropy_charts() -> list[dict[str, Any]]:
    """The policy's entropy against its target and band, and what the controller (PI law or gate) did."""
    return [
        {
            "id": "entropy",
            "title": "Policy entropy",
            "y": "entropy (nats)",
            "series": [
                _series("entropy/mean", "policy entropy"),
                _series("stare/target_entropy", "target entropy", dash=True),
                _series("control/target_entropy", "target entropy (PI law)", dash=True),
            ],
            "band": [catalogue.BAND_LOW, catalogue.BAND_HIGH],
        },
        {
            "id": "control",
            "title": "Entropy controller",
            "y": "u / e / I",
            "series": [
                _series("control/output", "output u"),
                _series("control/error", "error e (relative)"),
                _series("control/integral", "integral I", dash=True),
            ],
        },
        {
            "id": "actuator",
            "title": "Controller actuator",
            "y": "α, W or ε_high",
            "series": [_series("control/actuator", "actuator")],
        },
        {
            "id": "gate",
            "title": "STARE gate",
            "y": "gate / factor",
            "series": [
                _series("stare/gate_on", "gate on", stepped=True),
                _series("stare/reweight_w", "W (positive reweight)"),
                _series("stare/reweight_m", "M (negative reweight)"),
            ],
        },
    ]


def _response_charts() -> list[dict[str, Any]]:
    """What the responses were: the tokens' quadrant fractions, reward and accuracy, length."""
    quadrants = [_series(f"quadrant/{q}_fraction", label) for q, label in QUADRANT_LABELS.items()]
    return [
        {"id": "quadrants", "title": "Quadrant token fractions", "y": "fraction", "series": quadrants},
        {
            "id": "reward",
            "title": "Reward and accuracy",
            "y": "reward / accuracy",
            "series": [_series("reward/mean", "reward mean"), _series("reward/accuracy", "accuracy")],
        },
        {
            "id": "length",
            "title": "Response length",
            "y": "tokens",
            "series": [
                _series("response/length_mean", "mean length"),
                _series("response/length_max", "longest"),
            ],
        },
    ]


def _performance_charts() -> list[dict[str, Any]]:
    return [
        {
            "id": "throughput",
            "title": "Throughput",
            "y": "tokens/s",
            "series": [_series("perf/tokens_per_second", "tokens per second")],
        },
        {
            "id": "step_time",
            "title": "Step time",
            "y": "seconds",
            "series": [
                _series("perf/step_seconds", "step"),
                _series("perf/generation_seconds", "generation"),
                _series("perf/update_seconds", "update"),
            ],
        },
    ]


def _tool_chart() -> dict[str, Any]:
    """A tool-use job: every tool/ metric of the catalogue (docs/TOOLS.md)."""
    tools = [_series(m.key, m.key.removeprefix("tool/").replace("_", " ")) for m in catalogue.CATALOGUE]
    tools = [s for s in tools if s["key"].startswith("tool/")]
    return {"id": "tool", "title": "Tool use", "y": "per response / rate", "series": tools}


def _grader_chart() -> dict[str, Any]:
    """A job with a grader: its failures, scores and time (docs/GRADERS.md)."""
    return {
        "id": "grader",
        "title": "Grader health",
        "y": "rate / score / share",
        "series": [
            _series("grader/error_rate", "failed samples (step)"),
            _series("grader/window_error_rate", "failed samples (error window)", dash=True),
            _series("grader/score_mean", "score mean"),
            _series("grader/score_std", "score spread"),
            _series("grader/all_equal_groups", "all-equal groups"),
            _series("grader/step_share", "share of step time"),
        ],
    }
