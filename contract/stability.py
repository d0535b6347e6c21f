"""Entropy collapse and target holding: the two numbers that say whether a run kept its entropy.

One definition each, used by the trainer (as step metrics, so the job view, the job page, the report and
Prometheus read the same numbers) and by the results page (from the events of finished runs):

- **Time to collapse**: the first RL step t at which the step's token-mean entropy H̄ (entropy/mean) is
  below COLLAPSE_FRACTION × H₀ and stays below it for COLLAPSE_STREAK consecutive steps (t included); H₀ is
  H̄ of the first RL step. None (metric 0) while that has not happened. Relative to H₀ so that one rule fits
  a 0.5M-parameter toy (H₀ ≈ 0.6 nats) and a pretrained model (SmolLM2: H₀ ≈ 2.2 nats): a policy that has
  lost three quarters of its starting entropy has stopped exploring. The streak keeps one easy batch (4
  prompts a step on the CPU suites) from counting as a collapse.
- **Holding**: the share of post-gate steps whose H̄ is within ±HOLD_TOLERANCE of the target entropy
  (|H̄ − H_tgt| ≤ 0.25 H_tgt). The post-gate steps are the steps from the first one whose H̄ is below the
  resolved target (the step at which STARE's gate, gate_on = H̄ < H_tgt, first acts; the same rule for every
  method that has a target) to the last one. None while no step has gone below the target (nothing has been
  held yet), and None for a job without a target.
- **Holding as users see it** (the per-step share above counts every noisy batch): the 5-step moving
  average M_t of H̄ (the mean of H̄ over steps t−4..t; defined from the 5th step on). The settling step is
  the first step whose M_t is within ±HOLD_TOLERANCE of the target; from it on, the share of steps whose
  M_t is within the band (`ma_hold_fraction`), the mean absolute relative deviation |H̄ − H*|/H*
  (`mean_abs_deviation`, of the raw H̄), the same of the moving average, |M_t − H*|/H*
  (`ma_mean_abs_deviation`: what a user sees on a chart, with the sampler's step noise averaged down), and the
  largest excursion of the moving average above the target, max (M_t − H*)/H* (`ma_max_excursion`: the
  overshoot; 0 or less when M_t never went above the target).
- **Noise floor**: the spread of H̄ when one fixed policy's batch is re-sampled (`noise_floor`): the band a
  controller can hold per step is no narrower than this.
- **Step noise during a run** (`step_noise`): the root mean square successive difference of H̄ over √2,
  relative to the target (the von Neumann estimate of the step-to-step noise, blind to a level that moves
  slowly). A law that followed the level exactly would still show a mean |H̄ − H*|/H* of about 0.8 × this
  (the mean absolute value of a normal is √(2/π) ≈ 0.8 of its sd); the pretrained policy's noise floor is
  only its value at step 0.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

COLLAPSE_FRACTION = 0.25
COLLAPSE_STREAK = 5
HOLD_TOLERANCE = 0.25

COLLAPSE_STEP = "entropy/collapse_step"
HOLD_FRACTION = "entropy/target_hold_fraction"
POST_GATE_STEPS = "entropy/post_gate_steps"
MA_HOLD_FRACTION = "entropy/ma_hold_fraction"
SETTLING_STEP = "entropy/settling_step"
MEAN_ABS_DEVIATION = "entropy/mean_abs_deviation"
MA_MEAN_ABS_DEVIATION = "entropy/ma_mean_abs_deviation"
MA_MAX_EXCURSION = "entropy/ma_max_excursion"
MA_WINDOW = 5


def collapse_step(
    entropies: Sequence[tuple[int, float]],
    *,
    fraction: float = COLLAPSE_FRACTION,
    streak: int = COLLAPSE_STREAK,
) -> int | None:
    """Time to collapse over (step, H̄) pairs in step order (the first pair is the first RL step)."""
    if not entropies:
        return None
    threshold = fraction * entropies[0][1]
    run = 0
    for i, (_step, h) in enumerate(entropies):
        run = run + 1 if h < threshold else 0
        if run >= streak:
            return entropies[i - streak + 1][0]
    return None


def near_target(h: float, target: float, tolerance: float = HOLD_TOLERANCE) -> bool:
    return abs(h - target) <= tolerance * target


def hold_fraction(
    entropies: Sequence[tuple[int, float]], target: float | None, *, tolerance: float = HOLD_TOLERANCE
) -> tuple[float | None, int]:
    """(share of post-gate steps within ±tolerance of the target, number of post-gate steps)."""
    if target is None:
        return None, 0
    start = next((i for i, (_s, h) in enumerate(entropies) if h < target), None)
    if start is None:
        return None, 0
    window = [h for _s, h in entropies[start:]]
    return sum(near_target(h, target, tolerance) for h in window) / len(window), len(window)


@dataclass(frozen=True)
class Holding:
    """Holding as users see it over one run (module docstring); the settling step is 1-based like the RL
    steps, None (and the rest None) while the moving average has not entered the band."""

    settling_step: int | None
    ma_hold_fraction: float | None
    mean_abs_deviation: float | None
    steps: int  # steps from the settling step on
    ma_mean_abs_deviation: float | None = None
    ma_max_excursion: float | None = None


def moving_average(values: Sequence[float], window: int = MA_WINDOW) -> list[float | None]:
    """M_t, the mean of the last `window` values up to t; None for the first window − 1."""
    return [
        None if i + 1 < window else statistics.fmean(values[i + 1 - window : i + 1])
        for i in range(len(values))
    ]


def holding(
    entropies: Sequence[tuple[int, float]], target: float | None, *, tolerance: float = HOLD_TOLERANCE
) -> Holding:
    """The settling step, the moving average's share in the band and the mean |H̄ − H*|/H* from it on."""
    if target is None or target <= 0:
        return Holding(None, None, None, 0)
    ma = moving_average([h for _s, h in entropies])
    start = next((i for i, m in enumerate(ma) if m is not None and near_target(m, target, tolerance)), None)
    if start is None:
        return Holding(None, None, None, 0)
    window = ma[start:]
    share = sum(m is not None and near_target(m, target, tolerance) for m in window) / len(window)
    deviation = statistics.fmean(abs(h - target) / target for _s, h in entropies[start:])
    relative = [(m - target) / target for m in window if m is not None]
    return Holding(
        entropies[start][0],
        share,
        deviation,
        len(window),
        ma_mean_abs_deviation=statistics.fmean(abs(r) for r in relative),
        ma_max_excursion=max(relative),
    )


def step_noise(values: Sequence[float], target: float) -> float | None:
    """√(mean((H̄_{t+1} − H̄_t)²) / 2) / target over consecutive values; None for fewer than 3 or no target."""
    if len(values) < 3 or not target > 0:
        return None
    diffs = [b - a for a, b in itertools.pairwise(values)]
    return math.sqrt(statistics.fmean(d * d for d in diffs) / 2.0) / target


def noise_floor(samples: Sequence[float]) -> dict[str, float]:
    """The spread of H̄ over re-samples of one fixed policy's batch: mean, standard deviation and their
    ratio (the relative per-step noise a controller sees); at least 2 finite samples."""
    values = [float(v) for v in samples]
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"a noise floor needs at least 2 finite samples, got {samples!r}")
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    return {
        "mean": mean,
        "sd": sd,
        "relative_sd": sd / mean if mean > 0 else math.inf,
        "samples": len(values),
    }


@dataclass
class StabilityState:
    """What the running computation keeps between steps (saved in checkpoints)."""

    initial_entropy: float | None = None
    below_run: int = 0  # consecutive steps below the collapse threshold, up to the last one
    steps: int = 0  # RL steps seen
    collapse_step: int | None = None
    post_gate_steps: int = 0
    near_steps: int = 0
    # holding: the last MA_WINDOW H̄, the settling step and the sums from it on
    recent: list[float] = field(default_factory=list)
    settling_step: int | None = None
    settled_steps: int = 0
    ma_near_steps: int = 0
    abs_deviation_sum: float = 0.0
    ma_abs_deviation_sum: float = 0.0
    ma_max_excursion: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StabilityState:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


class StabilityTracker:
    """The two definitions step by step: `update` once per RL step, in order, equals the functions above
    over the series so far (tests/contract/test_stability.py holds them equal)."""

    def __init__(self, state: StabilityState | None = None) -> None:
        self.state = state or StabilityState()

    def update(self, h: float, target: float | None) -> dict[str, float]:
        st = self.state
        st.steps += 1
        if st.initial_entropy is None:
            st.initial_entropy = h
        if st.collapse_step is None:
            st.below_run = st.below_run + 1 if h < COLLAPSE_FRACTION * st.initial_entropy else 0
            if st.below_run >= COLLAPSE_STREAK:
                st.collapse_step = st.steps - COLLAPSE_STREAK + 1
        if target is not None and (st.post_gate_steps > 0 or h < target):
            st.post_gate_steps += 1
            st.near_steps += int(near_target(h, target))
        if target is not None and target > 0:
            st.recent = [*st.recent, h][-MA_WINDOW:]
            ma = statistics.fmean(st.recent) if len(st.recent) == MA_WINDOW else None
            if st.settling_step is None and ma is not None and near_target(ma, target):
                st.settling_step = st.steps
            if st.settling_step is not None and ma is not None:
                st.settled_steps += 1
                st.ma_near_steps += int(near_target(ma, target))
                st.abs_deviation_sum += abs(h - target) / target
                st.ma_abs_deviation_sum += abs(ma - target) / target
                excursion = (ma - target) / target
                st.ma_max_excursion = max(excursion, st.ma_max_excursion or excursion)
        return self.metrics()

    def metrics(self) -> dict[str, float]:
        st = self.state
        out = {COLLAPSE_STEP: float(st.collapse_step or 0), POST_GATE_STEPS: float(st.post_gate_steps)}
        if st.post_gate_steps:
            out[HOLD_FRACTION] = st.near_steps / st.post_gate_steps
        if st.settling_step is not None:
            out[SETTLING_STEP] = float(st.settling_step)
            out[MA_HOLD_FRACTION] = st.ma_near_steps / st.settled_steps
            out[MEAN_ABS_DEVIATION] = st.abs_deviation_sum / st.settled_steps
            out[MA_MEAN_ABS_DEVIATION] = st.ma_abs_deviation_sum / st.settled_steps
            if st.ma_max_excursion is not None:
                out[MA_MAX_EXCURSION] = st.ma_max_excursion
        return out
