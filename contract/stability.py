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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

COLLAPSE_FRACTION = 0.25
COLLAPSE_STREAK = 5
HOLD_TOLERANCE = 0.25

COLLAPSE_STEP = "entropy/collapse_step"
HOLD_FRACTION = "entropy/target_hold_fraction"
POST_GATE_STEPS = "entropy/post_gate_steps"


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


@dataclass
class StabilityState:
    """What the running computation keeps between steps (saved in checkpoints)."""

    initial_entropy: float | None = None
    below_run: int = 0  # consecutive steps below the collapse threshold, up to the last one
    steps: int = 0  # RL steps seen
    collapse_step: int | None = None
    post_gate_steps: int = 0
    near_steps: int = 0

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
        return self.metrics()

    def metrics(self) -> dict[str, float]:
        st = self.state
        out = {COLLAPSE_STEP: float(st.collapse_step or 0), POST_GATE_STEPS: float(st.post_gate_steps)}
        if st.post_gate_steps:
            out[HOLD_FRACTION] = st.near_steps / st.post_gate_steps
        return out
