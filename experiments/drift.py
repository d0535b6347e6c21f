"""Why the gate does not hold, measured: how much of a step's predicted entropy drift STARE's reweighting
can cancel, from the first-order quantities every step logs (docs/ALGORITHMS.md §1, §5).

Per step the engine logs, for the unweighted update (Â as estimated, before any STARE weight):
- D = quadrant/predicted_drift = Σ Â·Φ / N over all active tokens (negative: the update lowers entropy);
- D⁺ₕ = quadrant/pos_high_drift, the part from tokens with Â > 0 and s > H (each of them raises entropy);
- D⁻ₕ = quadrant/neg_high_drift (Â < 0, s > H: each lowers entropy);
- the token shares of those quadrants, and STARE's |L⁺|/N (stare/positive_reweight_ratio).

STARE O1 multiplies the surrogate of the tokens in L⁺ by W. L⁺ is the top-P share of T⁺ by surprisal, so
(on these steps) a subset of the Â > 0, s > H quadrant, and to first order the reweighted step's drift is
D + (W − 1)·D(L⁺) with 0 ≤ D(L⁺) ≤ D⁺ₕ. Two readings of D(L⁺), since the logs do not hold it:
- **bound**: D(L⁺) = D⁺ₕ (as if every high-surprisal positive token were reweighted). The share of D that
  W cancels is then at most (W − 1)·D⁺ₕ / (−D), and cancelling all of it needs W ≥ 1 + (−D)/D⁺ₕ.
- **token-share estimate**: D(L⁺) = D⁺ₕ·min(1, (|L⁺|/N) / share of the quadrant), i.e. L⁺ carries the
  quadrant's drift in proportion to its tokens; cancelling needs W ≈ 1 + (−D)/D(L⁺).
C2 also multiplies L⁻'s surrogate by M < 1, removing (1 − M)·D(L⁻) with D⁻ₕ ≤ D(L⁻) ≤ 0, by the same
reading.

The adaptive schedule raises W by α a step while H̄ < H_tgt: it reaches W* after (W* − 1)/α steps, so to
act before the collapse (t_c steps after the gate first acts) it needs w_max ≥ W* and α ≥ (W* − 1)/t_c.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TOTAL = "quadrant/predicted_drift"
POS_HIGH = "quadrant/pos_high_drift"
NEG_HIGH = "quadrant/neg_high_drift"
POS_HIGH_SHARE = "quadrant/pos_high_fraction"
NEG_HIGH_SHARE = "quadrant/neg_high_fraction"
L_PLUS = "stare/positive_reweight_ratio"
POS_CANDIDATES = "stare/positive_candidate_ratio"
ENTROPY = "entropy/mean"


@dataclass(frozen=True)
class StepDrift:
    step: int
    total: float  # D
    pos_high: float  # D⁺ₕ
    neg_high: float  # D⁻ₕ
    l_plus_share: float | None  # |L⁺| / |Q⁺ₕ| (tokens), capped at 1; None without STARE's metric
    l_plus_exceeds: bool = False  # |L⁺| > |Q⁺ₕ|: L⁺ also holds s ≤ H tokens (the bound's premise fails)
    post_gate: bool = True  # H̄ < target at this step


def step_drifts(
    steps: Sequence[tuple[int, Mapping[str, float]]], target: float | None, *, p: float = 0.1
) -> list[StepDrift]:
    """The steps whose update lowers entropy (D < 0) and has a positive D⁺ₕ, each marked post-gate or not
    (H̄ < target). A run without STARE's |L⁺|/N metric (grpo_ds, or STARE with its gate off) gets the share
    that P = `p` would select, P × the positive-advantage token share (stare/positive_candidate_ratio when
    logged, else the Â > 0 quadrants' shares)."""
    out = []
    for step, m in steps:
        if any(k not in m for k in (TOTAL, POS_HIGH, NEG_HIGH, ENTROPY)):
            continue
        d, dph = float(m[TOTAL]), float(m[POS_HIGH])
        if not (d < 0 and dph > 0 and math.isfinite(d) and math.isfinite(dph)):
            continue
        q = float(m.get(POS_HIGH_SHARE, 0.0))
        positive = m.get(POS_CANDIDATES, float(m.get("quadrant/pos_low_fraction", 0.0)) + q)
        lp = float(m[L_PLUS]) if float(m.get(L_PLUS, 0.0)) > 0 else p * float(positive)
        share = min(1.0, lp / q) if q > 0 else None
        post = target is None or float(m[ENTROPY]) < target
        out.append(StepDrift(step, d, dph, float(m[NEG_HIGH]), share, lp > q, post))
    return out


@dataclass(frozen=True)
class DriftAnalysis:
    steps: int
    runs: int
    post_gate: bool  # the medians are over post-gate steps (else over every step with D < 0: none was)
    total: float | None  # median D
    pos_high: float | None  # median D⁺ₕ
    neg_high: float | None  # median D⁻ₕ
    l_plus_share: float | None  # median |L⁺|/|Q⁺ₕ|
    l_plus_exceeds: float  # share of the steps where |L⁺| > |Q⁺ₕ|
    cancel_bound_at: dict[float, float]  # W → median share of −D cancelled, bound reading
    cancel_estimate_at: dict[float, float]  # W → median share, token-share reading
    cancel_c2_at: dict[float, float]  # M → median share of −D that (1 − M)·|D⁻ₕ| would cancel, at most
    w_bound: float | None  # median W that cancels D, bound reading (a lower bound on the W needed)
    w_estimate: float | None  # median W that cancels D, token-share reading
    w_summed: float | None  # W that cancels Σ D over the steps (bound reading): 1 + Σ(−D) / Σ D⁺ₕ
    cancel_summed: float | None  # share of Σ(−D) that W = 1.1 cancels (bound reading)


def analyse(
    per_run: Sequence[Sequence[StepDrift]],
    ws: Sequence[float] = (1.1, 1.5, 2.0),
    ms: Sequence[float] = (0.9, 0.5),
) -> DriftAnalysis:
    """Medians over the post-gate steps of every run, or over all their steps when none is post-gate."""
    every = [d for run in per_run for d in run]
    post = [d for d in every if d.post_gate]
    rows = post or every
    if not rows:
        return DriftAnalysis(0, 0, False, None, None, None, None, 0.0, {}, {}, {}, None, None, None, None)

    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    est = [d for d in rows if d.l_plus_share]
    loss, gain = sum(-d.total for d in rows), sum(d.pos_high for d in rows)
    return DriftAnalysis(
        steps=len(rows),
        runs=sum(1 for run in per_run if any(d in rows for d in run)),
        post_gate=bool(post),
        total=med([d.total for d in rows]),
        pos_high=med([d.pos_high for d in rows]),
        neg_high=med([d.neg_high for d in rows]),
        l_plus_share=med([d.l_plus_share for d in est if d.l_plus_share is not None]),
        l_plus_exceeds=sum(d.l_plus_exceeds for d in rows) / len(rows),
        cancel_bound_at={w: statistics.median((w - 1) * d.pos_high / -d.total for d in rows) for w in ws},
        cancel_estimate_at={
            w: statistics.median((w - 1) * d.pos_high * (d.l_plus_share or 0.0) / -d.total for d in est)
            for w in ws
            if est
        },
        cancel_c2_at={
            m: statistics.median((1 - m) * max(0.0, -d.neg_high) / -d.total for d in rows) for m in ms
        },
        w_bound=med([1 - d.total / d.pos_high for d in rows]),
        w_estimate=med([1 - d.total / (d.pos_high * d.l_plus_share) for d in est if d.l_plus_share]),
        w_summed=1 + loss / gain,
        cancel_summed=0.1 * gain / loss,
    )


def adaptive_gain(w_star: float, steps_to_collapse: float) -> float:
    """The schedule's α that takes W from 1 to w_star within `steps_to_collapse` post-gate steps."""
    if steps_to_collapse <= 0:
        raise ValueError("steps_to_collapse must be > 0")
    return (w_star - 1.0) / steps_to_collapse


def run_steps(events: Sequence[Mapping[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    out: dict[int, dict[str, float]] = {}
    for e in events:
        if e.get("type") == "step" and isinstance(e.get("metrics"), dict):
            out[int(e["step"])] = e["metrics"]
    return sorted(out.items())
