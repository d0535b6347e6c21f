"""The report page's charts (inline SVG, trainer/report/charts.py): one function per plot, in page order."""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial
from typing import Any

from trainer.report.charts import (
    BLUE,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    VERMILION,
    Band,
    Series,
    Trace,
    line_chart_svg,
)
from trainer.report.summary import (
    ACCURACY,
    BAND_HIGH,
    BAND_LOW,
    CONTROL_ACTUATOR,
    CONTROL_ERROR,
    CONTROL_INTEGRAL,
    CONTROL_OUTPUT,
    ENTROPY,
    EVAL_AVG,
    EVAL_PASS,
    GATE_ON,
    LENGTH,
    QUADRANT_LABELS,
    QUADRANTS,
    RESOLVED_TARGET,
    REWARD_MEAN,
    REWEIGHT_M,
    REWEIGHT_W,
    TARGET,
)


def _points(report: Mapping[str, Any], name: str) -> Series:
    return [(float(x), float(y)) for x, y in report["series"].get(name, [])]


def _entropy_bands(report: Mapping[str, Any]) -> list[Band]:
    """Piecewise-constant bands from the logged band, else the summary's (spec) band over the whole axis."""
    lows, highs = dict(_points(report, BAND_LOW)), dict(_points(report, BAND_HIGH))
    pieces: list[tuple[float, float, float]] = []  # (first step, low, high)
    for step in sorted(lows.keys() & highs.keys()):
        if not pieces or pieces[-1][1:] != (lows[step], highs[step]):
            pieces.append((step, lows[step], highs[step]))
    if not pieces:
        low, high = report["entropy"]["band_low"], report["entropy"]["band_high"]
        return [] if low is None or high is None else [Band(-math.inf, math.inf, low, high)]
    edges = [-math.inf, *(p[0] for p in pieces[1:]), math.inf]
    return [Band(edges[i], edges[i + 1], low, high) for i, (_, low, high) in enumerate(pieces)]


def _entropy_traces(report: Mapping[str, Any]) -> list[Trace]:
    """The entropy and its controller's target, resolved (a relative target as it resolved on the first
    step): the logged entropy/target, STARE's logged target, or the spec's absolute one."""
    entropy = _points(report, ENTROPY)
    target = report["gate"]["target_entropy"]
    target_points = _points(report, RESOLVED_TARGET) or _points(report, TARGET)
    if not target_points and target is not None and entropy:
        target_points = [(entropy[0][0], target), (entropy[-1][0], target)]
    traces = [Trace("policy entropy (token mean)", entropy, BLUE)]
    if target_points or report["job"]["algorithm"] == "stare":
        label = "STARE target entropy" if report["job"]["algorithm"] == "stare" else "target entropy"
        traces.append(Trace(label, target_points if entropy else [], VERMILION, dashed=True))
    return traces


def _eval_points(report: Mapping[str, Any]) -> tuple[str, Series]:
    """The evaluations' k as text and their response lengths by step."""
    k = report["evaluation"]["k"]
    history = report["evaluation"]["history"]
    lengths = [(float(r["step"]), r["response_length"]) for r in history if r["response_length"] is not None]
    return (str(k) if k is not None else "k"), lengths


def _controller_charts(report: Mapping[str, Any], chart: Any) -> list[tuple[str, str, str]]:
    """The PI law's output, error and integral over the steps, and its actuator; none for a job without
    a law (it logged none of them)."""
    keys = (CONTROL_OUTPUT, CONTROL_ERROR, CONTROL_INTEGRAL, CONTROL_ACTUATOR)
    if not any(report["series"].get(k) for k in keys):
        return []
    return [
        (
            "Entropy controller",
            "The PI law (docs/ALGORITHMS.md §11): error e = (H* − H)/H*, integral I, clipped output "
            "u = clip(Kp·e + Ki·I, ±u_max); u > 0 raises entropy.",
            chart(
                [
                    Trace("output u", _points(report, CONTROL_OUTPUT), BLUE),
                    Trace("error e (relative)", _points(report, CONTROL_ERROR), VERMILION),
                    Trace("integral I", _points(report, CONTROL_INTEGRAL), GREEN, dashed=True),
                ],
                title="Entropy controller",
                y_label="u / e / I",
            ),
        ),
        (
            "Controller actuator",
            "What the output sets each step: the bonus coefficient α (entropy_pi), W (stare_pi) or "
            "ε_high (clip_pi).",
            chart(
                [Trace("actuator", _points(report, CONTROL_ACTUATOR), ORANGE)],
                title="Controller actuator",
                y_label="α, W or ε_high",
            ),
        ),
    ]


Chart = Any  # line_chart_svg with the page's shared x range (functools.partial)
Plot = tuple[str, str, str]  # (title, caption, svg)


def report_charts(report: Mapping[str, Any]) -> list[Plot]:
    """(title, caption, svg) for each plot, in page order, on one x axis (the steps of every series)."""
    steps = [x for points in report["series"].values() for x, _ in points]
    chart = partial(line_chart_svg, x_range=(min(steps), max(steps)) if steps else None)
    return [
        _entropy_chart(report, chart),
        _quadrant_chart(report, chart),
        _reward_chart(report, chart),
        _length_chart(report, chart),
        _gate_chart(report, chart),
        *_controller_charts(report, chart),
    ]


def _entropy_chart(report: Mapping[str, Any], chart: Chart) -> Plot:
    traces = _entropy_traces(report)
    bands = _entropy_bands(report) if traces[0].points else []
    return (
        "Policy entropy",
        "Token-mean entropy of the policy on its own samples; the shaded region is the entropy band.",
        chart(
            traces, title="Policy entropy", y_label="entropy (nats)", bands=bands, band_label="entropy band"
        ),
    )


def _quadrant_chart(report: Mapping[str, Any], chart: Chart) -> Plot:
    colors = (BLUE, ORANGE, GREEN, VERMILION)
    return (
        "Quadrant token fractions",
        "Share of response tokens by advantage sign and by surprisal relative to the entropy "
        "(STARE, Fig. 2).",
        chart(
            [
                Trace(QUADRANT_LABELS[q], _points(report, f"quadrant/{q}_fraction"), color)
                for q, color in zip(QUADRANTS, colors)
            ],
            title="Quadrant token fractions",
            y_label="fraction of tokens",
            y_floor=0.0,
        ),
    )


def _reward_chart(report: Mapping[str, Any], chart: Chart) -> Plot:
    k_text, _ = _eval_points(report)
    return (
        "Reward and accuracy",
        f"Training reward and accuracy per step; dots are held-out evaluations (avg@{k_text}, pass@{k_text}).",
        chart(
            [
                Trace("reward mean", _points(report, REWARD_MEAN), BLUE),
                Trace("accuracy", _points(report, ACCURACY), ORANGE),
                Trace(f"eval avg@{k_text}", _points(report, EVAL_AVG), GREEN, shape="markers"),
                Trace(f"eval pass@{k_text}", _points(report, EVAL_PASS), PURPLE, shape="markers"),
            ],
            title="Reward and accuracy",
            y_label="reward / accuracy",
            y_floor=0.0,
        ),
    )


def _length_chart(report: Mapping[str, Any], chart: Chart) -> Plot:
    _, eval_lengths = _eval_points(report)
    return (
        "Response length",
        "Mean length of sampled responses in tokens; dots are evaluation responses.",
        chart(
            [
                Trace("train response length", _points(report, LENGTH), BLUE),
                Trace("eval response length", eval_lengths, GREEN, shape="markers"),
            ],
            title="Response length",
            y_label="tokens",
            y_floor=0.0,
        ),
    )


def _gate_chart(report: Mapping[str, Any], chart: Chart) -> Plot:
    return (
        "STARE gate",
        "Gate state (1: on, entropy below the target, reweighting active) and the reweighting factors W and M.",
        chart(
            [
                Trace("gate on", _points(report, GATE_ON), GREY, shape="step"),
                Trace("W (positive reweight)", _points(report, REWEIGHT_W), BLUE),
                Trace("M (negative reweight)", _points(report, REWEIGHT_M), ORANGE),
            ],
            title="STARE gate",
            y_label="gate / factor",
            y_floor=0.0,
        ),
    )
