"""The evaluation report of one run, built from its event stream (OUT/events.jsonl).

`build_report(events)` reduces the events to a JSON-serialisable dict: the job summary, evaluation before
and after RL training (avg@k, pass@k, response length, with deltas), the entropy summary against the band,
the STARE gate's duty cycle, the final quadrant token fractions and the per-step series that the page
plots. `write_report` writes report.json and a self-contained report.html (inline CSS and SVG, no script,
no external asset) next to each other, each atomically. `load_events` reads events.jsonl.

This module imports only the standard library: the HTTP service serves these files and never imports torch.

How the stream is read (the engine's writer is append-only, one JSON object per line):
- Any metric may be missing (baselines log no stare/*) and any value may be non-finite; both count as
  absent, so the report is strict JSON.
- A `resumed` event at step s restarts from the checkpoint at s: steps and evals after s that were logged
  before the crash are dropped, since the resumed run logs them again. A step logged twice keeps the last.
- The band state of a step is `entropy/band_state` when logged, else entropy against the band (the step's
  `entropy/band_low/high`, else the spec's `entropy_band`). Out-of-band runs count consecutive logged steps
  and do not distinguish below from above: a jump from above to below without passing the band is one run.
"""

from __future__ import annotations

import html
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

REPORT_VERSION = 1

QUADRANTS = ("pos_low", "pos_high", "neg_low", "neg_high")
QUADRANT_LABELS = {
    "pos_low": "Â>0, low surprisal",
    "pos_high": "Â>0, high surprisal",
    "neg_low": "Â<0, low surprisal",
    "neg_high": "Â<0, high surprisal",
}

ENTROPY = "entropy/mean"
BAND_LOW = "entropy/band_low"
BAND_HIGH = "entropy/band_high"
BAND_STATE = "entropy/band_state"
TARGET = "stare/target_entropy"
GATE_ON = "stare/gate_on"
REWEIGHT_W = "stare/reweight_w"
REWEIGHT_M = "stare/reweight_m"
REWARD_MEAN = "reward/mean"
ACCURACY = "reward/accuracy"
LENGTH = "response/length_mean"
EVAL_AVG = "eval/avg@k"
EVAL_PASS = "eval/pass@k"
EVAL_K = "eval/k"
EVAL_LENGTH = "eval/response_length"
EVAL_PROMPTS = "eval/num_prompts"

# The per-step metrics whose series go into the report (the ones the page plots).
SERIES_METRICS = (
    ENTROPY,
    BAND_LOW,
    BAND_HIGH,
    TARGET,
    *(f"quadrant/{q}_fraction" for q in QUADRANTS),
    REWARD_MEAN,
    ACCURACY,
    LENGTH,
    GATE_ON,
    REWEIGHT_W,
    REWEIGHT_M,
)

Point = tuple[float, float]
Series = list[Point]


# ---------------------------------------------------------------------------------------------- reading


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """The events of events.jsonl, in order.

    A torn last line (the writer died mid-line) is skipped silently. A malformed line elsewhere (a torn
    line that a resumed run appended after) is skipped with a warning rather than losing the whole report.
    """
    lines = Path(path).read_bytes().split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    events: list[dict[str, Any]] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            event = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            if number != len(lines):
                logger.warning("%s:%d: skipping a malformed event line", path, number)
            continue
        if isinstance(event, dict):
            events.append(event)
        else:
            logger.warning("%s:%d: skipping an event that is not a JSON object", path, number)
    return events


def _number(value: Any) -> float | None:
    """A finite float, or None for anything else (missing, NaN, inf, strings, nested values)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # an int beyond float range
            return None
        return number if math.isfinite(number) else None
    return None


def _step_of(event: Mapping[str, Any]) -> int | None:
    step = event.get("step")
    if isinstance(step, bool) or not isinstance(step, int | float) or not math.isfinite(step):
        return None
    return int(step)


def _dig(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def _text(value: Any) -> str | None:
    return None if value is None or isinstance(value, dict | list) else str(value)


@dataclass
class _Stream:
    """The events folded into per-step state (resumes applied, duplicates resolved)."""

    spec: dict[str, Any]
    total_steps: int | None
    started_at: str | None
    finished_at: str | None
    status: str
    error: str | None
    resumes: int
    steps: dict[int, dict[str, float]]
    evals: dict[int, dict[str, float]]
    checkpoints: dict[int, str]
    finished_step: int | None
    event_count: int


def _fold(events: Iterable[Any]) -> _Stream:
    s = _Stream({}, None, None, None, "pending", None, 0, {}, {}, {}, None, 0)
    for event in events:
        if not isinstance(event, Mapping):
            continue
        s.event_count += 1
        kind, step = event.get("type"), _step_of(event)
        if kind == "started":
            spec = event.get("spec")
            s.spec = dict(spec) if isinstance(spec, Mapping) else {}
            total = _number(event.get("total_steps"))
            s.total_steps = int(total) if total is not None else None
            s.started_at = s.started_at or _text(event.get("time"))  # a restarted engine keeps the first
            s.status = "running"
        elif kind in ("step", "eval") and step is not None:
            metrics = event.get("metrics")
            values = {
                str(name): v
                for name, raw in (metrics.items() if isinstance(metrics, Mapping) else ())
                if (v := _number(raw)) is not None
            }
            (s.steps if kind == "step" else s.evals)[step] = values
        elif kind == "checkpoint" and step is not None:
            s.checkpoints[step] = _text(event.get("path")) or ""
        elif kind == "resumed":
            s.resumes += 1
            s.status, s.error, s.finished_at, s.finished_step = "running", None, None, None
            if step is not None:
                for table in (s.steps, s.evals):
                    for later in [k for k in table if k > step]:
                        del table[later]
        elif kind == "finished":
            s.status = _text(event.get("status")) or "succeeded"
            s.finished_at = _text(event.get("time"))
            s.finished_step = step
        elif kind == "interrupted":  # stopped by a signal after a checkpoint; a resume continues it
            s.status = "interrupted"
        elif kind == "error":
            s.status = "failed"
            s.finished_at = _text(event.get("time"))
            s.error = _text(event.get("message")) or _text(event.get("error")) or "error"
    return s


# ---------------------------------------------------------------------------------------------- summary


def _series(steps: Mapping[int, Mapping[str, float]], name: str) -> Series:
    return [(float(k), steps[k][name]) for k in sorted(steps) if name in steps[k]]


def _last(steps: Mapping[int, Mapping[str, float]], name: str) -> float | None:
    series = _series(steps, name)
    return series[-1][1] if series else None


def _spec_band(spec: Mapping[str, Any]) -> tuple[float, float] | None:
    low, high = _number(_dig(spec, "entropy_band", "low")), _number(_dig(spec, "entropy_band", "high"))
    return (low, high) if low is not None and high is not None else None


def _band_at(
    metrics: Mapping[str, float], fallback: tuple[float, float] | None
) -> tuple[float, float] | None:
    if BAND_LOW in metrics and BAND_HIGH in metrics:
        return metrics[BAND_LOW], metrics[BAND_HIGH]
    return fallback


def _band_states(s: _Stream) -> list[tuple[int, int]]:
    """(step, state) for each step whose band state is known: -1 below, 0 in band, 1 above."""
    fallback = _spec_band(s.spec)
    states: list[tuple[int, int]] = []
    for step in sorted(s.steps):
        metrics = s.steps[step]
        band = _band_at(metrics, fallback)
        if BAND_STATE in metrics:
            state = int(math.copysign(1, metrics[BAND_STATE])) if metrics[BAND_STATE] != 0 else 0
        elif ENTROPY in metrics and band is not None:
            entropy = metrics[ENTROPY]
            state = -1 if entropy < band[0] else 1 if entropy > band[1] else 0
        else:
            continue
        states.append((step, state))
    return states


def _runs_out_of_band(states: Sequence[int]) -> tuple[int, int]:
    """(longest run, trailing run) of consecutive out-of-band states."""
    longest = current = 0
    for state in states:
        current = current + 1 if state != 0 else 0
        longest = max(longest, current)
    return longest, current


def _entropy_summary(s: _Stream) -> dict[str, Any]:
    series = _series(s.steps, ENTROPY)
    values = [v for _, v in series]
    states = _band_states(s)
    flags = [state for _, state in states]
    longest, trailing = _runs_out_of_band(flags)
    last_band = None
    for step in sorted(s.steps, reverse=True):
        last_band = _band_at(s.steps[step], None)
        if last_band is not None:
            break
    band = last_band or _spec_band(s.spec)
    min_i = min(range(len(values)), key=values.__getitem__) if values else None
    max_i = max(range(len(values)), key=values.__getitem__) if values else None
    return {
        "first": values[0] if values else None,
        "last": values[-1] if values else None,
        "min": values[min_i] if min_i is not None else None,
        "min_step": int(series[min_i][0]) if min_i is not None else None,
        "max": values[max_i] if max_i is not None else None,
        "max_step": int(series[max_i][0]) if max_i is not None else None,
        "mean": sum(values) / len(values) if values else None,
        "band_low": band[0] if band else None,
        "band_high": band[1] if band else None,
        "steps_with_state": len(flags),
        "fraction_in_band": flags.count(0) / len(flags) if flags else None,
        "steps_in_band": flags.count(0),
        "steps_below": flags.count(-1),
        "steps_above": flags.count(1),
        "longest_out_of_band_run": longest,
        "current_out_of_band_run": trailing,
        "last_state": {-1: "below", 0: "in_band", 1: "above"}[flags[-1]] if flags else None,
    }


def _target_entropy(s: _Stream) -> float | None:
    logged = _last(s.steps, TARGET)
    if logged is not None:
        return logged
    if _dig(s.spec, "algorithm", "name") == "stare":
        return _number(_dig(s.spec, "algorithm", "gate", "target_entropy"))
    return None


def _gate_summary(s: _Stream) -> dict[str, Any]:
    flags = [v >= 0.5 for _, v in _series(s.steps, GATE_ON)]
    return {
        "steps_logged": len(flags),
        "on_steps": sum(flags),
        "on_fraction": sum(flags) / len(flags) if flags else None,
        "toggles": sum(a != b for a, b in pairwise(flags)),
        "final_on": flags[-1] if flags else None,
        "target_entropy": _target_entropy(s),
        "final_w": _last(s.steps, REWEIGHT_W),
        "final_m": _last(s.steps, REWEIGHT_M),
    }


def _quadrant_summary(s: _Stream) -> dict[str, Any]:
    names = [f"quadrant/{q}_{kind}" for q in QUADRANTS for kind in ("fraction", "drift")]
    names.append("quadrant/predicted_drift")
    final_step = max((k for k in s.steps if any(n in s.steps[k] for n in names)), default=None)
    metrics = s.steps[final_step] if final_step is not None else {}
    return {
        "step": final_step,
        "fractions": {q: metrics.get(f"quadrant/{q}_fraction") for q in QUADRANTS},
        "drift": {q: metrics.get(f"quadrant/{q}_drift") for q in QUADRANTS},
        "predicted_drift": metrics.get("quadrant/predicted_drift"),
    }


def _eval_row(step: int, metrics: Mapping[str, float]) -> dict[str, Any]:
    def as_int(name: str) -> int | None:
        return int(metrics[name]) if name in metrics else None

    return {
        "step": step,
        "avg_at_k": metrics.get(EVAL_AVG),
        "pass_at_k": metrics.get(EVAL_PASS),
        "k": as_int(EVAL_K),
        "response_length": metrics.get(EVAL_LENGTH),
        "num_prompts": as_int(EVAL_PROMPTS),
    }


def _delta(after: Mapping[str, Any] | None, before: Mapping[str, Any] | None, key: str) -> float | None:
    if after is None or before is None or after.get(key) is None or before.get(key) is None:
        return None
    return float(after[key] - before[key])


def _evaluation_summary(s: _Stream) -> dict[str, Any]:
    history = [_eval_row(step, s.evals[step]) for step in sorted(s.evals)]
    before = history[0] if history and history[0]["step"] == 0 else None
    after = history[-1] if history and history[-1]["step"] > 0 else None
    k = next((row["k"] for row in reversed(history) if row["k"] is not None), None)
    return {
        "k": k,
        "before": before,
        "after": after,
        "delta": {key: _delta(after, before, key) for key in ("avg_at_k", "pass_at_k", "response_length")},
        "history": history,
    }


def _stats(series: Series) -> dict[str, float | None]:
    values = [v for _, v in series]
    return {
        "first": values[0] if values else None,
        "last": values[-1] if values else None,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "mean": sum(values) / len(values) if values else None,
    }


def _duration_s(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    try:
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except (ValueError, TypeError):  # unparseable, or one aware and one naive
        return None


def build_report(events: Iterable[Any]) -> dict[str, Any]:
    """The report of a run (see the module docstring); plain JSON types only, no NaN."""
    s = _fold(events)
    steps_done = max(s.steps, default=0)
    if s.finished_step is not None:
        steps_done = max(steps_done, s.finished_step)
    total = s.total_steps if s.total_steps is not None else _number(_dig(s.spec, "optim", "steps"))
    evaluation = _evaluation_summary(s)
    lengths = _stats(_series(s.steps, LENGTH))
    before, after = evaluation["before"], evaluation["after"]
    series: dict[str, list[list[float]]] = {}
    for name in SERIES_METRICS:
        points = _series(s.steps, name)
        if points:
            series[name] = [[int(x), y] for x, y in points]
    for name in (EVAL_AVG, EVAL_PASS):
        points = _series(s.evals, name)
        if points:
            series[name] = [[int(x), y] for x, y in points]
    return {
        "report_version": REPORT_VERSION,
        "job": {
            "name": _text(s.spec.get("name")),
            "algorithm": _text(_dig(s.spec, "algorithm", "name")),
            "advantage": _text(_dig(s.spec, "algorithm", "advantage")),
            "model": _text(_dig(s.spec, "model", "name")),
            "status": s.status,
            "error": s.error,
            "steps_done": steps_done,
            "total_steps": int(total) if total is not None else None,
            "started_at": s.started_at,
            "finished_at": s.finished_at,
            "duration_s": _duration_s(s.started_at, s.finished_at),
            "resumes": s.resumes,
            "checkpoints": [{"step": k, "path": s.checkpoints[k]} for k in sorted(s.checkpoints)],
            "events": s.event_count,
        },
        "evaluation": evaluation,
        "response_length": {
            "train": lengths,
            "eval_before": before["response_length"] if before else None,
            "eval_after": after["response_length"] if after else None,
            "eval_delta": evaluation["delta"]["response_length"],
        },
        "reward": {
            "mean": _stats(_series(s.steps, REWARD_MEAN)),
            "accuracy": _stats(_series(s.steps, ACCURACY)),
        },
        "entropy": _entropy_summary(s),
        "gate": _gate_summary(s),
        "quadrants": _quadrant_summary(s),
        "perf": {
            "step_seconds_mean": _stats(_series(s.steps, "perf/step_seconds"))["mean"],
            "tokens_per_second_mean": _stats(_series(s.steps, "perf/tokens_per_second"))["mean"],
        },
        "series": series,
    }


# ---------------------------------------------------------------------------------------------- SVG


@dataclass(frozen=True)
class Trace:
    """One series of a chart: a line, a step function (each value holds until the next point) or dots."""

    label: str
    points: Sequence[Point]
    color: str
    dashed: bool = False
    shape: Literal["line", "step", "markers"] = "line"


@dataclass(frozen=True)
class Band:
    """A shaded horizontal band between `low` and `high` over x in [x0, x1]."""

    x0: float
    x1: float
    low: float
    high: float


# Okabe–Ito: distinguishable under the common colour-vision deficiencies.
BLUE, ORANGE, GREEN, VERMILION, PURPLE = "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7"
GREY = "#6B7280"
BAND_FILL = "#009E73"

_MAX_PLOTTED_POINTS = 1200  # per trace; longer series are thinned to per-bucket min and max


@dataclass(frozen=True)
class _Scale:
    left: float
    top: float
    plot_w: float
    plot_h: float
    x0: float
    x1: float
    y_lo: float
    y_hi: float

    def px(self, x: float) -> float:
        return round(self.left + (x - self.x0) / (self.x1 - self.x0) * self.plot_w, 1)

    def py(self, y: float) -> float:
        return round(self.top + (self.y_hi - y) / (self.y_hi - self.y_lo) * self.plot_h, 1)


def _nice_step(span: float, target_ticks: int) -> float:
    """The 1-2-2.5-5 × 10^e tick spacing that gives about target_ticks intervals over span (> 0)."""
    raw = span / target_ticks
    magnitude = 10.0 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * magnitude >= raw * (1 - 1e-9))


def _decimals(step: float) -> int:
    exponent = math.floor(math.log10(step) + 1e-9)
    mantissa = round(step / 10.0**exponent, 6)
    return max(0, -exponent + (1 if mantissa == 2.5 else 0))


def _ticks(lo: float, hi: float, step: float) -> list[tuple[float, str]]:
    """The multiples of step in [lo, hi] with labels, in thousands ("5k") when the axis reaches 10 000."""
    scale, suffix = (1000.0, "k") if max(abs(lo), abs(hi)) >= 10_000 else (1.0, "")
    decimals = _decimals(step / scale)
    ticks = []
    for i in range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1):
        text = f"{i * step / scale:.{decimals}f}"
        ticks.append((i * step, "0" if float(text) == 0 else text + suffix))
    return ticks


def _thin(points: Sequence[Point], limit: int = _MAX_PLOTTED_POINTS) -> Sequence[Point]:
    """At most about `limit` points, keeping each bucket's extremes so that spikes survive."""
    if len(points) <= limit:
        return points
    buckets = limit // 2
    size = len(points) / buckets
    kept: list[Point] = []
    for b in range(buckets):
        chunk = points[int(b * size) : int((b + 1) * size)]
        if chunk:
            kept.extend(sorted({min(chunk, key=lambda p: p[1]), max(chunk, key=lambda p: p[1])}))
    return kept


def _legend_width(label: str) -> float:
    return 30 + 6.8 * len(label) + 22


def _legend_svg(
    traces: Sequence[Trace], band_label: str | None, left: float, width: float
) -> tuple[str, float]:
    """The legend rows above the plot, and their height."""
    entries: list[tuple[str, str, str]] = [("band", BAND_FILL, band_label)] if band_label else []
    for t in traces:
        kind: str = "dash" if t.dashed else t.shape
        entries.append((kind, t.color, t.label) if t.points else (kind, "#C0C4CC", f"{t.label} (no data)"))
    if not entries:
        return "", 0.0
    out: list[str] = []
    x, y = left, 16.0
    for kind, color, label in entries:
        if x > left and x + _legend_width(label) > width:
            x, y = left, y + 22
        if kind == "band":
            out.append(
                f'<rect x="{x}" y="{y - 6}" width="22" height="12" fill="{BAND_FILL}" fill-opacity="0.18" '
                f'stroke="{BAND_FILL}" stroke-opacity="0.5"/>'
            )
        elif kind == "markers":
            out.append(f'<circle cx="{x + 11}" cy="{y}" r="4.5" fill="{color}"/>')
        else:
            dash = ' stroke-dasharray="6 4"' if kind == "dash" else ""
            out.append(
                f'<line x1="{x}" y1="{y}" x2="{x + 22}" y2="{y}" stroke="{color}" stroke-width="2.5"{dash}/>'
            )
        out.append(f'<text x="{x + 30}" y="{y + 4}" fill="#374151">{html.escape(label)}</text>')
        x += _legend_width(label)
    return "".join(out), y + 12


def _scale(
    traces: Sequence[Trace],
    bands: Sequence[Band],
    y_floor: float | None,
    x_range: tuple[float, float] | None,
    box: tuple[float, float, float, float],
) -> tuple[_Scale, float, float]:
    """The data-to-pixel mapping (y snapped to ticks) and the x and y tick spacings."""
    xs = [p[0] for t in traces for p in t.points] + list(x_range or ())
    ys = [p[1] for t in traces for p in t.points]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    y_lo, y_hi = min([*ys, *(b.low for b in bands)]), max([*ys, *(b.high for b in bands)])
    if y_floor is not None and y_floor <= y_lo:
        y_lo = y_floor
    if y_hi == y_lo:
        pad = max(abs(y_hi) * 0.1, 0.5)
        y_hi += pad
        if y_floor is None or y_lo - pad >= y_floor:
            y_lo -= pad
    y_step = _nice_step(y_hi - y_lo, 5)
    y_lo = math.floor(y_lo / y_step + 1e-9) * y_step
    y_hi = math.ceil(y_hi / y_step - 1e-9) * y_step
    x_step = _nice_step(x1 - x0, 8)
    if x1 - x0 >= 1:
        x_step = max(1.0, x_step)  # steps are integers: no tick between two of them
    return _Scale(*box, x0, x1, y_lo, y_hi), x_step, y_step


def _axes_svg(sc: _Scale, x_step: float, y_step: float, x_label: str, y_label: str, height: float) -> str:
    bottom, right = sc.top + sc.plot_h, sc.left + sc.plot_w
    out = [f'<rect x="{sc.left}" y="{sc.top}" width="{sc.plot_w}" height="{sc.plot_h}" fill="#FCFCFD"/>']
    for v, label in _ticks(sc.y_lo, sc.y_hi, y_step):
        y = sc.py(v)
        out.append(f'<line x1="{sc.left}" y1="{y}" x2="{right}" y2="{y}" stroke="#E9ECF1"/>')
        out.append(f'<line x1="{sc.left - 5}" y1="{y}" x2="{sc.left}" y2="{y}" stroke="#6B7280"/>')
        out.append(f'<text x="{sc.left - 8}" y="{y + 4}" text-anchor="end" fill="#4B5563">{label}</text>')
    for v, label in _ticks(sc.x0, sc.x1, x_step):
        x = sc.px(v)
        out.append(f'<line x1="{x}" y1="{sc.top}" x2="{x}" y2="{bottom}" stroke="#F1F3F6"/>')
        out.append(f'<line x1="{x}" y1="{bottom}" x2="{x}" y2="{bottom + 5}" stroke="#6B7280"/>')
        out.append(f'<text x="{x}" y="{bottom + 18}" text-anchor="middle" fill="#4B5563">{label}</text>')
    out.append(f'<path d="M{sc.left} {sc.top}V{bottom}H{right}" fill="none" stroke="#6B7280"/>')
    out.append(
        f'<text x="{sc.left + sc.plot_w / 2}" y="{height - 8}" text-anchor="middle" fill="#374151" '
        f'font-weight="600">{html.escape(x_label)}</text>'
    )
    cy = sc.top + sc.plot_h / 2
    out.append(
        f'<text x="18" y="{cy}" text-anchor="middle" fill="#374151" font-weight="600" '
        f'transform="rotate(-90 18 {cy})">{html.escape(y_label)}</text>'
    )
    return "".join(out)


def _bands_svg(sc: _Scale, bands: Sequence[Band], label: str) -> str:
    out: list[str] = []
    for b in bands:
        x_a, x_b = sc.px(max(b.x0, sc.x0)), sc.px(min(b.x1, sc.x1))
        y_a, y_b = sc.py(min(b.high, sc.y_hi)), sc.py(max(b.low, sc.y_lo))
        if x_b <= x_a:
            continue
        out.append(
            f'<rect class="band" x="{x_a}" y="{y_a}" width="{round(x_b - x_a, 1)}" '
            f'height="{round(max(y_b - y_a, 0.5), 1)}" fill="{BAND_FILL}" fill-opacity="0.13">'
            f"<title>{html.escape(label)} [{b.low:g}, {b.high:g}]</title></rect>"
        )
        for edge in (y_a, y_b):
            out.append(
                f'<line x1="{x_a}" y1="{edge}" x2="{x_b}" y2="{edge}" stroke="{BAND_FILL}" '
                f'stroke-opacity="0.5" stroke-dasharray="2 3"/>'
            )
    return "".join(out)


def _trace_svg(sc: _Scale, t: Trace) -> str:
    points = _thin(sorted(t.points))
    label = html.escape(t.label)
    dash = ' stroke-dasharray="7 5"' if t.dashed else ""
    out: list[str] = []
    if len(points) > 1:
        if t.shape == "step":
            d = f"M{sc.px(points[0][0])} {sc.py(points[0][1])}" + "".join(
                f"H{sc.px(x)}V{sc.py(y)}" for x, y in points[1:]
            )
            base = sc.py(max(sc.y_lo, 0.0))
            area = f"{d}V{base}H{sc.px(points[0][0])}Z"
            out.append(f'<path d="{area}" fill="{t.color}" fill-opacity="0.12" stroke="none"/>')
            out.append(f'<path d="{d}" fill="none" stroke="{t.color}" stroke-width="2"{dash}>')
        else:
            coords = " ".join(f"{sc.px(x)},{sc.py(y)}" for x, y in points)
            style = ' stroke-opacity="0.5" stroke-dasharray="2 4"' if t.shape == "markers" else dash
            width = 1.5 if t.shape == "markers" or len(points) > 300 else 2
            out.append(
                f'<polyline points="{coords}" fill="none" stroke="{t.color}" stroke-width="{width}" '
                f'stroke-linejoin="round"{style}>'
            )
        out.append(f"<title>{label}</title>{'</path>' if t.shape == 'step' else '</polyline>'}")
    if t.shape == "markers" or len(points) == 1:
        for x, y in points:
            out.append(
                f'<circle cx="{sc.px(x)}" cy="{sc.py(y)}" r="4.5" fill="{t.color}" stroke="#fff" '
                f'stroke-width="1.5"><title>{label}, step {x:g}: {y:.4g}</title></circle>'
            )
    return "".join(out)


def line_chart_svg(
    traces: Sequence[Trace],
    *,
    title: str,
    y_label: str,
    x_label: str = "step",
    bands: Sequence[Band] = (),
    band_label: str = "band",
    y_floor: float | None = None,
    x_range: tuple[float, float] | None = None,
    width: int = 960,
    height: int = 300,
) -> str:
    """An inline SVG line chart: axes with ticks and labels, a legend, shaded bands, no script.

    With no point in any trace it draws an empty frame saying "no data" (and no legend); a trace with one
    point is drawn as a marker; a trace with no point is listed in the legend as "(no data)". `y_floor`
    pins the bottom of the y axis (0 for fractions) when no value lies below it; `x_range` is the least
    x extent (the charts of one page share it so that their steps line up).
    """
    plotted = [t for t in traces if t.points]
    # Without any point the legend would only repeat "no data": the frame says it once.
    legend, legend_h = (
        _legend_svg(traces, band_label if bands else None, 70, width - 20) if plotted else ("", 0.0)
    )
    box = (70.0, legend_h + 12, width - 70.0 - 22, height - legend_h - 12 - 50)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{html.escape(title)}" class="chart" font-size="12">',
        f"<title>{html.escape(title)}</title>",
        legend,
    ]
    if not plotted:
        left, top, plot_w, plot_h = box
        out.append(
            f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#FAFAFB" '
            f'stroke="#E5E7EB" stroke-dasharray="4 4"/><text class="no-data" x="{left + plot_w / 2}" '
            f'y="{top + plot_h / 2 + 6}" text-anchor="middle" fill="#9CA3AF" font-size="16">no data</text>'
            "</svg>"
        )
        return "".join(out)
    sc, x_step, y_step = _scale(plotted, bands, y_floor, x_range, box)
    out.append(_axes_svg(sc, x_step, y_step, x_label, y_label, height))
    out.append(_bands_svg(sc, bands, band_label))
    out.extend(_trace_svg(sc, t) for t in sorted(plotted, key=lambda t: t.shape == "markers"))  # dots on top
    out.append("</svg>")
    return "".join(out)


# ---------------------------------------------------------------------------------------------- HTML


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


def _charts(report: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(title, caption, svg) for each plot, in page order."""
    entropy = _points(report, ENTROPY)
    target = report["gate"]["target_entropy"]
    target_points = _points(report, TARGET)
    if not target_points and target is not None and entropy:
        target_points = [(entropy[0][0], target), (entropy[-1][0], target)]
    entropy_traces = [Trace("policy entropy (token mean)", entropy, BLUE)]
    if target_points or report["job"]["algorithm"] == "stare":
        entropy_traces.append(
            Trace("STARE target entropy", target_points if entropy else [], VERMILION, dashed=True)
        )
    bands = _entropy_bands(report) if entropy else []
    steps = [x for points in report["series"].values() for x, _ in points]
    chart = partial(line_chart_svg, x_range=(min(steps), max(steps)) if steps else None)
    colors = (BLUE, ORANGE, GREEN, VERMILION)
    history = report["evaluation"]["history"]
    k = report["evaluation"]["k"]
    k_text = str(k) if k is not None else "k"
    eval_lengths = [
        (float(r["step"]), r["response_length"]) for r in history if r["response_length"] is not None
    ]
    return [
        (
            "Policy entropy",
            "Token-mean entropy of the policy on its own samples; the shaded region is the entropy band.",
            chart(
                entropy_traces,
                title="Policy entropy",
                y_label="entropy (nats)",
                bands=bands,
                band_label="entropy band",
            ),
        ),
        (
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
        ),
        (
            "Reward and accuracy",
            "Training reward and accuracy per step; dots are held-out evaluations "
            f"(avg@{k_text}, pass@{k_text}).",
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
        ),
        (
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
        ),
        (
            "STARE gate",
            "Gate state (1: on, entropy below the target, reweighting active) and the reweighting "
            "factors W and M.",
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
        ),
    ]


def _fmt(value: Any) -> str:
    """A number for a table cell: thousands separated from 1000 up, else 4 significant digits."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        text = f"{value:.4g}"
        return text if any(c in text for c in ".en") else f"{text}.0"  # 1.0, not 1, next to 0.36
    return html.escape(str(value))


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _signed(value: float | None, *, judged: bool = True) -> str:
    """A signed delta, green when up and red when down if `judged` (a longer response is neither)."""
    if value is None:
        return '<span class="muted">—</span>'
    tone = "flat" if value == 0 or not judged else "good" if value > 0 else "bad"
    return f'<span class="delta {tone}">{"+" if value > 0 else ""}{_fmt(value)}</span>'


def _muted(text: str) -> str:
    return f' <span class="muted">{text}</span>'


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    hours, rest = divmod(round(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def _rows(pairs: Iterable[tuple[str, str]]) -> str:
    return "".join(f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>" for k, v in pairs)


def _tile(label: str, value: str, note: str) -> str:
    return (
        f'<div class="tile"><div class="tile-label">{html.escape(label)}</div>'
        f'<div class="tile-value">{value}</div><div class="tile-note">{note}</div></div>'
    )


def _status(status: str) -> str:
    return f'<span class="status status-{html.escape(status)}">{html.escape(status)}</span>'


def _k(report: Mapping[str, Any]) -> str:
    k = report["evaluation"]["k"]
    return "k" if k is None else str(k)


def _title(job: Mapping[str, Any]) -> str:
    return str(job["name"] or f"{job['algorithm'] or 'RL'} run")


_STATE_TEXT = {"in_band": "in band", "below": "below the band", "above": "above the band"}


def _job_rows(job: Mapping[str, Any]) -> list[tuple[str, str]]:
    done, total = job["steps_done"], job["total_steps"]
    progress = min(1.0, done / total) if total else 0.0
    bar = f'<span class="bar"><span style="width:{progress * 100:.1f}%"></span></span>'
    checkpoints = job["checkpoints"]
    last = checkpoints[-1] if checkpoints else None
    rows = [
        (
            "Algorithm",
            _fmt(job["algorithm"])
            + (_muted(f"advantage: {_fmt(job['advantage'])}") if job["advantage"] else ""),
        ),
        ("Model", _fmt(job["model"])),
        ("Status", _status(str(job["status"]))),
        ("Steps", f"{_fmt(done)} / {_fmt(total)} {bar}"),
        ("Started", _fmt(job["started_at"])),
        ("Finished", _fmt(job["finished_at"])),
        ("Duration", _duration(job["duration_s"])),
        ("Resumes", _fmt(job["resumes"])),
        (
            "Checkpoints",
            str(len(checkpoints))
            + (
                _muted(f"last at step {last['step']}: <code>{html.escape(last['path'])}</code>")
                if last
                else ""
            ),
        ),
    ]
    if job["error"]:
        rows.append(("Error", f'<span class="error">{html.escape(job["error"])}</span>'))
    return rows


def _header_html(report: Mapping[str, Any]) -> str:
    job, ev, ent, gate = report["job"], report["evaluation"], report["entropy"], report["gate"]
    after, k = ev["after"] or {}, _k(report)
    vs_start = " vs step 0"
    tiles = [
        _tile(f"avg@{k} after RL", _fmt(after.get("avg_at_k")), _signed(ev["delta"]["avg_at_k"]) + vs_start),
        _tile(
            f"pass@{k} after RL", _fmt(after.get("pass_at_k")), _signed(ev["delta"]["pass_at_k"]) + vs_start
        ),
        _tile(
            "entropy (last step)", _fmt(ent["last"]), _STATE_TEXT.get(ent["last_state"] or "", "not logged")
        ),
        _tile(
            "steps in band",
            _pct(ent["fraction_in_band"]),
            f"longest excursion: {_count(ent['longest_out_of_band_run'], 'step')}",
        ),
        _tile(
            "STARE gate on",
            _pct(gate["on_fraction"]),
            f"{gate['on_steps']:,} of {_count(gate['steps_logged'], 'step')}"
            if gate["steps_logged"]
            else "not logged",
        ),
    ]
    subtitle = " · ".join(html.escape(str(v)) for v in (job["algorithm"], job["model"]) if v)
    return (
        f'<header><div class="kicker">Evaluation report</div><h1>{html.escape(_title(job))}</h1>'
        f'<p class="sub">{subtitle + " · " if subtitle else ""}{_status(str(job["status"]))}</p></header>'
        f'<section class="tiles">{"".join(tiles)}</section>'
        f'<section class="card"><h2>Job</h2><table class="kv">{_rows(_job_rows(job))}</table></section>'
    )


def _evaluation_html(report: Mapping[str, Any]) -> str:
    ev, train = report["evaluation"], report["response_length"]["train"]
    before, after, delta, k = ev["before"] or {}, ev["after"] or {}, ev["delta"], _k(report)
    rows = "".join(
        f"<tr><th>{label}</th><td>{_fmt(before.get(key))}</td><td>{_fmt(after.get(key))}</td>"
        f"<td>{_signed(delta[key], judged=judged)}</td></tr>"
        for label, key, judged in (
            (f"avg@{k}", "avg_at_k", True),
            (f"pass@{k}", "pass_at_k", True),
            ("response length (tokens)", "response_length", False),
        )
    )
    notes = []
    prompts = after.get("num_prompts") or before.get("num_prompts")
    if prompts is not None:
        notes.append(f"Evaluated on {_count(prompts, 'prompt')} with k = {html.escape(k)} samples each.")
    if train["first"] is not None:
        notes.append(
            f"Training responses: {_fmt(train['first'])} tokens at the first step, {_fmt(train['last'])} "
            f"at the last (mean {_fmt(train['mean'])})."
        )
    after_head = f"after (step {after['step']})" if after else "after"
    return (
        '<section class="card"><h2>Evaluation before and after RL</h2><table class="num"><thead><tr><th></th>'
        f"<th>before (step 0)</th><th>{after_head}</th><th>Δ</th></tr></thead><tbody>{rows}</tbody></table>"
        + (f'<p class="note">{" ".join(notes)}</p>' if notes else "")
        + "</section>"
    )


def _entropy_html(report: Mapping[str, Any]) -> str:
    ent, gate, quads = report["entropy"], report["gate"], report["quadrants"]
    band = "—" if ent["band_low"] is None else f"[{_fmt(ent['band_low'])}, {_fmt(ent['band_high'])}] nats"
    entropy_rows = [
        ("First / last", f"{_fmt(ent['first'])} / {_fmt(ent['last'])}"),
        (
            "Min",
            _fmt(ent["min"]) + (_muted(f"at step {ent['min_step']}") if ent["min_step"] is not None else ""),
        ),
        (
            "Max",
            _fmt(ent["max"]) + (_muted(f"at step {ent['max_step']}") if ent["max_step"] is not None else ""),
        ),
        ("Band", band),
        (
            "Steps in band",
            _pct(ent["fraction_in_band"])
            + (
                _muted(f"({ent['steps_in_band']:,} of {ent['steps_with_state']:,})")
                if ent["steps_with_state"]
                else ""
            ),
        ),
        ("Steps below / above", f"{ent['steps_below']:,} / {ent['steps_above']:,}"),
        ("Longest out-of-band run", _count(ent["longest_out_of_band_run"], "step")),
        ("Current out-of-band run", _count(ent["current_out_of_band_run"], "step")),
    ]
    gate_on = (
        _pct(gate["on_fraction"])
        + _muted(
            f"({gate['on_steps']:,} of {_count(gate['steps_logged'], 'step')}, "
            f"{_count(gate['toggles'], 'toggle')})"
        )
        if gate["steps_logged"]
        else "not logged"
    )
    gate_rows = [
        ("Gate on", gate_on),
        ("Target entropy", "—" if gate["target_entropy"] is None else f"{_fmt(gate['target_entropy'])} nats"),
        ("Final W / M", f"{_fmt(gate['final_w'])} / {_fmt(gate['final_m'])}"),
    ]
    quad_rows = "".join(
        f"<tr><th>{html.escape(QUADRANT_LABELS[q])}</th><td>{_pct(quads['fractions'][q])}</td>"
        f"<td>{_fmt(quads['drift'][q])}</td></tr>"
        for q in QUADRANTS
    )
    quad_step = f" (step {quads['step']})" if quads["step"] is not None else ""
    return (
        '<section class="cols"><div class="card"><h2>Entropy</h2>'
        f'<table class="kv">{_rows(entropy_rows)}</table></div>'
        f'<div class="card"><h2>STARE gate</h2><table class="kv">{_rows(gate_rows)}</table>'
        f'<h3>Final quadrants{quad_step}</h3><table class="num"><thead><tr><th></th><th>tokens</th>'
        f"<th>predicted drift</th></tr></thead><tbody>{quad_rows}</tbody>"
        "<tfoot><tr><th>total predicted drift</th>"
        f"<td></td><td>{_fmt(quads['predicted_drift'])}</td></tr></tfoot></table></div></section>"
    )


def _history_html(report: Mapping[str, Any]) -> str:
    history, k = report["evaluation"]["history"], _k(report)
    if not history:
        return (
            '<section class="card"><h2>Evaluation history</h2><p class="muted">No evaluation yet.</p>'
            "</section>"
        )
    rows = "".join(
        f"<tr><td>{r['step']}</td><td>{_fmt(r['avg_at_k'])}</td><td>{_fmt(r['pass_at_k'])}</td>"
        f"<td>{_fmt(r['k'])}</td><td>{_fmt(r['response_length'])}</td><td>{_fmt(r['num_prompts'])}</td></tr>"
        for r in history
    )
    return (
        '<section class="card"><h2>Evaluation history</h2><table class="num grid"><thead><tr><th>step</th>'
        f"<th>avg@{html.escape(k)}</th><th>pass@{html.escape(k)}</th><th>k</th><th>response length</th>"
        f"<th>prompts</th></tr></thead><tbody>{rows}</tbody></table></section>"
    )


_CSS = """
:root{--fg:#111827;--muted:#6B7280;--line:#E5E7EB;--card:#fff;--bg:#F5F6F8;--accent:#0072B2}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,
"Helvetica Neue",Arial,sans-serif}
main{max-width:1080px;margin:0 auto;padding:28px 20px 40px}
header{margin-bottom:18px}
.kicker{text-transform:uppercase;letter-spacing:.08em;font-size:12px;color:var(--muted);font-weight:600}
h1{font-size:26px;margin:2px 0 4px;word-break:break-word}
h2{font-size:16px;margin:0 0 10px}
h3{font-size:14px;margin:16px 0 6px}
.sub{margin:0;color:var(--muted)}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:16px 18px;
margin-bottom:16px;box-shadow:0 1px 2px rgba(16,24,40,.04)}
.cols{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:16px;margin-bottom:16px}
.cols .card{margin-bottom:0}
.cols table.kv th{width:52%}
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:12px;margin-bottom:16px}
.tile{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 14px}
.tile-label{font-size:12px;color:var(--muted)}
.tile-value{font-size:24px;font-weight:650;font-variant-numeric:tabular-nums}
.tile-note{font-size:12px;color:var(--muted)}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:5px 8px;border-bottom:1px solid #F0F1F4;text-align:left;vertical-align:top}
table.kv th{width:38%;color:var(--muted);font-weight:500}
table.num td{text-align:right}
table.num thead th{text-align:right;color:var(--muted);font-weight:500;font-size:12px}
table.num thead th:first-child{text-align:left}
table.grid td:first-child{text-align:left}
tfoot th,tfoot td{border-bottom:0;font-weight:600}
code{font-size:12px;background:#F3F4F6;padding:1px 4px;border-radius:4px;word-break:break-all}
.muted{color:var(--muted)}
.note{color:var(--muted);font-size:13px;margin:10px 0 0}
.delta{font-weight:600}.delta.good{color:#047857}.delta.bad{color:#B91C1C}.delta.flat{color:#374151}
.status{display:inline-block;padding:1px 8px;border-radius:999px;font-size:12px;font-weight:600;
background:#E5E7EB;color:#374151}
.status-succeeded{background:#D1FAE5;color:#065F46}.status-failed{background:#FEE2E2;color:#991B1B}
.status-running{background:#DBEAFE;color:#1E40AF}
.status-cancelled,.status-interrupted{background:#FEF3C7;color:#92400E}
.error{color:#991B1B;white-space:pre-wrap}
.bar{display:inline-block;width:120px;height:6px;background:#E5E7EB;border-radius:3px;margin-left:8px;
vertical-align:middle;overflow:hidden}
.bar span{display:block;height:100%;background:var(--accent)}
figure{margin:0}
figcaption{color:var(--muted);font-size:13px;margin:-4px 0 6px}
svg.chart{display:block;width:100%;height:auto}
footer{color:var(--muted);font-size:12px;text-align:center;margin-top:8px}
@media print{body{background:#fff}.card,.tile{box-shadow:none;break-inside:avoid}}
"""


def render_html(report: Mapping[str, Any]) -> str:
    """The self-contained page for a report from build_report (inline CSS and SVG; no script, no link)."""
    job = report["job"]
    plots = "".join(
        f'<section class="card"><figure><h2>{html.escape(name)}</h2><figcaption>{html.escape(caption)}'
        f"</figcaption>{svg}</figure></section>"
        for name, caption, svg in _charts(report)
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>Report · {html.escape(_title(job))}</title><style>{_CSS}</style></head><body><main>"
        f"{_header_html(report)}{_evaluation_html(report)}{_entropy_html(report)}{plots}"
        f"{_history_html(report)}"
        f"<footer>stare-rl report v{report['report_version']} · built from {job['events']} events</footer>"
        "</main></body></html>\n"
    )


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the service may read it as another user
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(events: Iterable[Any], out_dir: str | Path) -> tuple[Path, Path]:
    """Write out_dir/report.json and out_dir/report.html, each atomically; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = build_report(events)
    json_path, html_path = out / "report.json", out / "report.html"
    _write_atomic(json_path, json.dumps(report, separators=(",", ":"), allow_nan=False) + "\n")
    _write_atomic(html_path, render_html(report))
    return json_path, html_path
