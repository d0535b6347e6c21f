"""The report's numbers: the event stream folded into the JSON-serialisable summary (`build_report`).

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

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Any

from contract.control.pi import saturation_alert
from contract.metrics import BandState
from contract.metrics import get as metric
from contract.numbers import finite
from contract.stability import collapse_step, hold_fraction, holding
from trainer.report.charts import Series
from trainer.report.notes import fold_notes

REPORT_VERSION = 1

QUADRANTS = ("pos_low", "pos_high", "neg_low", "neg_high")
QUADRANT_LABELS = {
    "pos_low": "Â>0, low surprisal",
    "pos_high": "Â>0, high surprisal",
    "neg_low": "Â<0, low surprisal",
    "neg_high": "Â<0, high surprisal",
}

# The metrics the report reads, by their catalogue keys (contract.metrics: a key not there fails at import).
ENTROPY = metric("entropy/mean").key
BAND_LOW = metric("entropy/band_low").key
BAND_HIGH = metric("entropy/band_high").key
BAND_STATE = metric("entropy/band_state").key
TARGET = metric("stare/target_entropy").key
RESOLVED_TARGET = metric("entropy/target").key
GATE_ON = metric("stare/gate_on").key
REWEIGHT_W = metric("stare/reweight_w").key
REWEIGHT_M = metric("stare/reweight_m").key
REWARD_MEAN = metric("reward/mean").key
ACCURACY = metric("reward/accuracy").key
LENGTH = metric("response/length_mean").key
EVAL_AVG = metric("eval/avg@k").key
EVAL_PASS = metric("eval/pass@k").key
EVAL_K = metric("eval/k").key
EVAL_LENGTH = metric("eval/response_length").key
EVAL_PROMPTS = metric("eval/num_prompts").key
# The PI laws' controller (docs/ALGORITHMS.md §11).
CONTROL_OUTPUT = metric("control/output").key
CONTROL_ERROR = metric("control/error").key
CONTROL_INTEGRAL = metric("control/integral").key
CONTROL_ACTUATOR = metric("control/actuator").key
CONTROL_SATURATED = metric("control/saturated").key
CONTROL_SATURATED_STEPS = metric("control/saturated_steps").key

# The per-step metrics whose series go into the report (the ones the page plots).
SERIES_METRICS = (
    ENTROPY,
    BAND_LOW,
    BAND_HIGH,
    TARGET,
    RESOLVED_TARGET,
    *(f"quadrant/{q}_fraction" for q in QUADRANTS),
    REWARD_MEAN,
    ACCURACY,
    LENGTH,
    GATE_ON,
    REWEIGHT_W,
    REWEIGHT_M,
    CONTROL_OUTPUT,
    CONTROL_ERROR,
    CONTROL_INTEGRAL,
    CONTROL_ACTUATOR,
)


# ---------------------------------------------------------------------------------------------- reading


def _number(value: Any) -> float | None:
    """A finite float, or None for anything else (missing, NaN, inf, strings, nested values); a boolean
    reads as 0 or 1 (a flag such as the gate's)."""
    if isinstance(value, bool):
        return float(value)
    return finite(value)


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
            state = BandState.from_code(metrics[BAND_STATE])
        elif ENTROPY in metrics and band is not None:
            state = BandState.of(metrics[ENTROPY], band[0], band[1])
        else:
            continue
        states.append((step, state.code))
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
        "last_state": BandState.from_code(flags[-1]).label if flags else None,
        **_stability(series, _target_entropy(s)),
    }


def _stability(series: Sequence[tuple[float, float]], target: float | None) -> dict[str, Any]:
    """Time to collapse and target holding (contract/stability.py) over the logged entropy series."""
    steps = [(int(step), value) for step, value in series]
    share, window = hold_fraction(steps, target)
    held = holding(steps, target)
    return {
        "collapse_step": collapse_step(steps),
        "target_hold_fraction": share,
        "post_gate_steps": window,
        "settling_step": held.settling_step,
        "ma_hold_fraction": held.ma_hold_fraction,
        "mean_abs_deviation": held.mean_abs_deviation,
    }


def _target_entropy(s: _Stream) -> float | None:
    """The resolved target as the steps logged it; before any step, the spec's absolute target."""
    for key in (RESOLVED_TARGET, TARGET):
        logged = _last(s.steps, key)
        if logged is not None:
            return logged
    if _dig(s.spec, "algorithm", "name") == "stare":
        return _number(_dig(s.spec, "algorithm", "control", "target_entropy"))  # None when relative
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


def _controller_summary(s: _Stream) -> dict[str, Any]:
    """The PI law's output, error, integral and actuator at the last step, and how long it sat at its clip
    (absent values: a job without a PI law)."""
    saturated = [v >= 0.5 for _, v in _series(s.steps, CONTROL_SATURATED)]
    runs = [v for _, v in _series(s.steps, CONTROL_SATURATED_STEPS)]
    current = int(runs[-1]) if runs else None
    return {
        "steps_logged": len(saturated),
        "final_output": _last(s.steps, CONTROL_OUTPUT),
        "final_error": _last(s.steps, CONTROL_ERROR),
        "final_integral": _last(s.steps, CONTROL_INTEGRAL),
        "final_actuator": _last(s.steps, CONTROL_ACTUATOR),
        "saturated_fraction": sum(saturated) / len(saturated) if saturated else None,
        "longest_saturated_run": int(max(runs)) if runs else None,
        "final_saturated_steps": current,
        # At its clip for the alert's count of steps at the last step (ControllerSaturated).
        "saturated": saturation_alert(current, _last(s.steps, CONTROL_OUTPUT)),
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
    """The report of a run (module docstring) and its samples and warnings (trainer.report.notes); no NaN."""
    events = list(events)
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
        "controller": _controller_summary(s),
        "quadrants": _quadrant_summary(s),
        "perf": {
            "step_seconds_mean": _stats(_series(s.steps, "perf/step_seconds"))["mean"],
            "tokens_per_second_mean": _stats(_series(s.steps, "perf/tokens_per_second"))["mean"],
        },
        "series": series,
        **fold_notes(events),
    }
