"""From runs' events to the page's numbers: per-run summaries, per-arm aggregates over seeds, the paired
STARE-vs-GRPO-ds comparison and the first-order check of the entropy analysis.

Everything here reads events.jsonl only (what the engine wrote), so a table can always be checked against
the events it came from; tests/experiments do exactly that.

Definitions (also on the page):
- final avg@k / pass@k: the last `eval` event of the run (after the last step).
- after SFT: the step-0 `eval` event (before any RL update).
- in band: entropy/mean within [entropy_band.low, entropy_band.high] of the spec; the fraction counts steps
  after the suite's warm-up.
- collapse: entropy/mean below entropy_band.low for `collapse_steps` consecutive steps; the step reported
  is the first of that streak (None: never).
- near target (STARE and the adaptive bonus): |H − H_tgt| ≤ 0.25·H_tgt.
- predicted drift: quadrant/predicted_drift (Σ Â·Φ over the step's tokens, token-mean normalised), times
  the step's learning rate (the analysis' Δz = η Â (e_a − p)); measured drift: H of the next step's batch
  minus H of this step's batch.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from contract import stability

ENTROPY = "entropy/mean"
GATE_ON = "stare/gate_on"
BONUS = "entropy_bonus/coef"
TARGET_KEYS = ("stare/target_entropy", "entropy_bonus/target_entropy")
NEAR_TARGET = 0.25  # relative half-width of "near the target"


@dataclass(frozen=True)
class RunSummary:
    run: str
    arm: str | None
    seed: int
    threads: int
    steps: int
    finished: bool
    sft_avg: float | None  # step-0 eval
    sft_pass: float | None
    final_avg: float | None
    final_pass: float | None
    k: int | None
    entropy_first: float | None
    entropy_last: float | None
    entropy_min: float | None
    in_band_fraction: float | None
    collapse_step: int | None
    gate_on_fraction: float | None
    near_target_fraction: float | None  # of the steps after the gate first turned on / the bonus first acted
    first_control_step: int | None
    response_length: float | None
    wall_seconds: float | None
    reweight_ratio_when_on: float | None
    mean_weight_when_on: float | None
    # contract/stability.py over entropy/mean: time to collapse (relative to the first step's entropy) and
    # the share of post-gate steps within ±25 % of the target (the logged target, else the spec's gate
    # target: the suite's shared target for a method without a controller).
    collapse_time: int | None = None
    hold_fraction: float | None = None
    post_gate_steps: int = 0


def _steps(events: Iterable[Mapping[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    out = {}
    for e in events:
        if e.get("type") == "step" and isinstance(e.get("metrics"), dict):
            out[int(e["step"])] = e["metrics"]
    return sorted(out.items())


def _evals(events: Iterable[Mapping[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    out = []
    for e in events:
        if e.get("type") == "eval" and isinstance(e.get("metrics"), dict):
            out.append((int(e.get("step", 0)), e["metrics"]))
    return out


def _spec(events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    for e in events:
        if e.get("type") == "started" and isinstance(e.get("spec"), dict):
            return e["spec"]
    return {}


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def collapse_step(entropies: Sequence[tuple[int, float]], low: float, streak: int) -> int | None:
    run = 0
    for i, (_step, h) in enumerate(entropies):
        run = run + 1 if h < low else 0
        if run >= streak:
            return entropies[i - streak + 1][0]
    return None


def spec_target(
    spec: Mapping[str, Any],
    entropies: Sequence[tuple[int, float]],
    plan_spec: Mapping[str, Any] | None = None,
) -> float | None:
    """The suite's shared target (what a method without a controller is measured against): the run's
    started spec's controller section (`control`, or the older `gate`), else the plan's own spec for the run
    (a method without a controller starts with no section at all: validation drops it); nats, or
    {relative: r} × H₀ (H₀: the first step's entropy/mean)."""
    for source in (spec, plan_spec or {}):
        algorithm = source.get("algorithm") or {}
        for section in ("control", "gate"):
            setting = (algorithm.get(section) or {}).get("target_entropy")
            if isinstance(setting, dict) and isinstance(setting.get("relative"), int | float):
                return float(setting["relative"]) * entropies[0][1] if entropies else None
            if isinstance(setting, int | float):
                return float(setting)
    return None


def summarize_run(
    run_id: str,
    events: Sequence[Mapping[str, Any]],
    *,
    arm: str | None = None,
    seed: int = 0,
    threads: int = 1,
    warmup_steps: int = 10,
    collapse_streak: int = 10,
    wall_seconds: float | None = None,
    plan_spec: Mapping[str, Any] | None = None,
) -> RunSummary:
    spec = _spec(events)
    steps = _steps(events)
    evals = _evals(events)
    band = spec.get("entropy_band") or {}
    low, high = float(band.get("low", 0.1)), float(band.get("high", 1.0))
    entropies = [(s, float(m[ENTROPY])) for s, m in steps if ENTROPY in m]
    after_warmup = [h for s, h in entropies if s > warmup_steps]
    in_band = [low <= h <= high for h in after_warmup]
    gate = [float(m[GATE_ON]) for _, m in steps if GATE_ON in m]
    bonus = [(s, float(m[BONUS])) for s, m in steps if BONUS in m]
    target = next((float(m[k]) for _, m in steps for k in TARGET_KEYS if k in m), None)
    control = [(s, float(m[GATE_ON])) for s, m in steps if GATE_ON in m] or [
        (s, float(c > 0)) for s, c in bonus
    ]
    first_on = next((s for s, on in control if on > 0), None)
    near = None
    if target is not None and first_on is not None:
        later = [h for s, h in entropies if s >= first_on]
        near = _mean([float(abs(h - target) <= NEAR_TARGET * target) for h in later])
    on_metrics = [m for _, m in steps if m.get(GATE_ON, 0.0) > 0]
    shared_target = target if target is not None else spec_target(spec, entropies, plan_spec)
    hold, window = stability.hold_fraction(entropies, None if shared_target is None else float(shared_target))
    first_eval = next((m for s, m in evals if s == 0), None)
    last_eval = evals[-1][1] if evals and (evals[-1][0] > 0 or not steps) else None
    return RunSummary(
        run=run_id,
        arm=arm,
        seed=seed,
        threads=threads,
        steps=len(steps),
        finished=any(e.get("type") == "finished" for e in events),
        sft_avg=_get(first_eval, "eval/avg@k"),
        sft_pass=_get(first_eval, "eval/pass@k"),
        final_avg=_get(last_eval, "eval/avg@k"),
        final_pass=_get(last_eval, "eval/pass@k"),
        k=int(last_eval["eval/k"]) if last_eval and "eval/k" in last_eval else None,
        entropy_first=entropies[0][1] if entropies else None,
        entropy_last=entropies[-1][1] if entropies else None,
        entropy_min=min(h for _, h in entropies) if entropies else None,
        in_band_fraction=_mean([float(x) for x in in_band]),
        collapse_step=collapse_step(entropies, low, collapse_streak),
        gate_on_fraction=_mean(gate),
        near_target_fraction=near,
        first_control_step=first_on,
        response_length=_mean(
            [float(m["response/length_mean"]) for _, m in steps if "response/length_mean" in m]
        ),
        wall_seconds=wall_seconds if wall_seconds is not None else _wall(events),
        reweight_ratio_when_on=_mean(
            [
                float(m["stare/positive_reweight_ratio"])
                for m in on_metrics
                if "stare/positive_reweight_ratio" in m
            ]
        ),
        mean_weight_when_on=_mean(
            [float(m["stare/mean_weight"]) for m in on_metrics if "stare/mean_weight" in m]
        ),
        collapse_time=stability.collapse_step(entropies),
        hold_fraction=hold,
        post_gate_steps=window,
    )


def _get(metrics: Mapping[str, Any] | None, key: str) -> float | None:
    if not metrics or key not in metrics:
        return None
    return float(metrics[key])


def _wall(events: Sequence[Mapping[str, Any]]) -> float | None:
    times = [str(e["time"]) for e in events if isinstance(e.get("time"), str)]
    if len(times) < 2:
        return None
    try:
        return (datetime.fromisoformat(times[-1]) - datetime.fromisoformat(times[0])).total_seconds()
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------- statistics

# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom; beyond, the normal's 1.96.
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t975(df: int) -> float:
    if df < 1:
        raise ValueError("degrees of freedom must be ≥ 1")
    return _T975[df - 1] if df <= len(_T975) else 1.96


@dataclass(frozen=True)
class MeanStd:
    mean: float | None
    std: float | None  # sample standard deviation (n − 1); None below 2 values
    n: int


def mean_std(values: Iterable[float | None]) -> MeanStd:
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return MeanStd(None, None, 0)
    return MeanStd(statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else None, len(xs))


@dataclass(frozen=True)
class PairedDiff:
    metric: str
    mean: float | None  # mean of (treatment − control) over paired seeds
    low: float | None  # 95 % t interval
    high: float | None
    n: int
    significant: bool  # the interval excludes 0


def paired_difference(metric: str, pairs: Sequence[tuple[float, float]]) -> PairedDiff:
    """(treatment, control) per seed → mean difference with a 95 % t interval."""
    diffs = [t - c for t, c in pairs]
    n = len(diffs)
    if n == 0:
        return PairedDiff(metric, None, None, None, 0, False)
    mean = statistics.fmean(diffs)
    if n < 2:
        return PairedDiff(metric, mean, None, None, n, False)
    sd = statistics.stdev(diffs)
    half = t975(n - 1) * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    # Two seeds, or differences without any spread (pass@k moves in steps of 1/prompts), give an interval
    # that says nothing about the seed-to-seed variation: never called significant.
    spread = sd > 1e-9 * max(1.0, abs(mean))
    return PairedDiff(metric, mean, low, high, n, n >= 3 and spread and (low > 0 or high < 0))


@dataclass(frozen=True)
class Correlation:
    r: float | None
    low: float | None  # 95 % interval (Fisher z)
    high: float | None
    n: int


def pearson(xs: Sequence[float], ys: Sequence[float]) -> Correlation:
    n = len(xs)
    if n != len(ys):
        raise ValueError("xs and ys must have the same length")
    if n < 3:
        return Correlation(None, None, None, n)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return Correlation(None, None, None, n)
    r = max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))
    if n < 4 or abs(r) == 1.0:
        return Correlation(r, None, None, n)
    z, se = math.atanh(r), 1.0 / math.sqrt(n - 3)
    return Correlation(r, math.tanh(z - 1.96 * se), math.tanh(z + 1.96 * se), n)


def drift_pairs(events: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """(predicted, measured) entropy change per step: lr·Σ Â·Φ of step k against H_{k+1} − H_k."""
    steps = _steps(events)
    out = []
    for (s0, m0), (s1, m1) in itertools.pairwise(steps):
        if s1 != s0 + 1:
            continue
        pred, lr = m0.get("quadrant/predicted_drift"), m0.get("actor/lr")
        if pred is None or lr is None or ENTROPY not in m0 or ENTROPY not in m1:
            continue
        out.append((float(pred) * float(lr), float(m1[ENTROPY]) - float(m0[ENTROPY])))
    return out


def seed_band(
    series: Sequence[Sequence[tuple[int, float]]],
) -> tuple[list[tuple[float, float]], list[tuple[float, float]], list[tuple[float, float]]]:
    """Per step over runs: (mean, min, max) point lists, at the steps every run has."""
    if not series:
        return [], [], []
    maps = [dict(s) for s in series]
    shared = sorted(set.intersection(*(set(m) for m in maps)))
    mean = [(float(s), statistics.fmean(m[s] for m in maps)) for s in shared]
    lo = [(float(s), min(m[s] for m in maps)) for s in shared]
    hi = [(float(s), max(m[s] for m in maps)) for s in shared]
    return mean, lo, hi


def metric_series(events: Sequence[Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(s, float(m[key])) for s, m in _steps(events) if key in m and m[key] is not None]


def eval_series(events: Sequence[Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(s, float(m[key])) for s, m in _evals(events) if key in m]
