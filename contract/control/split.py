"""The second-generation entropy law, `entropy_split`: one damped PI law driving two actuators in split range
(docs/ALGORITHMS.md §12), declared.

Once per optimiser step, before the update, from H̄ (the token-mean entropy of π_old over the step batch):

    e    = (H* − H̄) / H*                    relative shortfall (> 0 below the target)
    e_f  = λ·e_f + (1 − λ)·e                 the filtered error, for the proportional term only
    v    = Kp·e_f + Ki·(I + e)               the integral runs on the raw error (no lag in it)
    u    = clip(v, max(−u_min, min(u_prev, 0) − r), min(u_max, max(u_prev, 0) + r))
                                              clipped, and rate-limited away from 0 (toward 0: free)
    I   ← I + e unless u is held at a limit (a clip or the rate) that e pushes v further past
          (conditional integration: anti-windup of both actuators and of the rate limit)

The output drives one of two actuators (split range; both are 0 at u = 0, so crossing 0 is bumpless: the
actuators' values are continuous in u and the one integral carries across):
- u > 0, raising: the entropy bonus α = span_up·u, loss − α·H_t on the tokens of rows with Â ≠ 0;
- u < 0, lowering: confident-token sharpening κ = span_down·(−u): on tokens that π_old already gives
  p ≥ p_conf, the per-token surrogate is weighted 1 + κ·sign(Â). It sharpens only what the policy is already
  sure of, never the forking tokens (p < p_conf), so it cannot drive the collapse the way a negative bonus
  does (trainer/algos/split_control.py, the actuator).

Armed: the lowering actuator acts only once the entropy has come down to the target (the filtered error has
reached 0) the first time. Before that the entropy is on its way down from H₀ and RL's own drift lowers it,
often fast (on the tuning cell 0.9 → 0.4 nats in three steps): lowering then only deepens the undershoot, and
a sharpened policy takes far more bonus to raise than it took to lower (§12.2). A target above H₀ arms at once.

Mode `floor`: the target is a floor. The law acts only below it: while the filtered entropy is above the
floor the output is 0 and the integral only unwinds (it never goes below 0), and the lowering actuator is
never used. Mode `hold` (the default): two-sided around the target.

`open_loop`: a fixed output schedule [[from_step, u], …] instead of the law, for measuring the plant's
step responses (experiments/plant.py); the state still records e.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from contract.control.base import Controller, ControlSettings, ControlState, OwnAlgorithm
from contract.control.pi import LAW_METRICS, OUTPUT, SATURATED_STEPS
from contract.control.pi import read as pi_read
from contract.hyperparams import ClipLossParams
from contract.metrics_types import Surface, metric

NAME = "entropy_split"
# The floor mode's default, relative to H₀: the collapse rule is H̄ below 0.25 × H₀ for 5 steps
# (contract/stability.py). 0.5 leaves a factor 2 of room: on the tuning cell one step took entropy from
# 0.35 to 0.14 nats (−60 %), and at a floor of 0.35 × H₀ the law, acting only below it, let entropy sit at
# 0.1–0.2 × H₀ for seven steps before it came back (ctl2-tune, docs/ALGORITHMS.md §12.4).
FLOOR = 0.5
# The law's first defaults (the first held-out round of experiments/control2_suite.py ran with them).
FIRST_DEFAULTS = {"kp": 1.0, "ki": 0.1, "filter": 0.3, "rate": 0.35}
Step = Annotated[int, Field(ge=1, le=10_000_000)]
Schedule = Annotated[
    list[tuple[Step, Annotated[float, Field(ge=-1.0, le=1.0)]]], Field(min_length=1, max_length=100)
]


class SplitSettings(ControlSettings):
    """entropy_split's settings (algorithm.control)."""

    controller: Literal["entropy_split"] = "entropy_split"
    mode: Literal["hold", "floor"] = "hold"
    # The second defaults (docs/ALGORITHMS.md §12.4): the first ones (kp 1, ki 0.1, λ 0.3, rate 0.35) are
    # FIRST_DEFAULTS, what the first held-out round ran with.
    kp: Annotated[float, Field(ge=0.0, le=1000.0)] = 2.0
    ki: Annotated[float, Field(ge=0.0, le=1000.0)] = 0.05
    filter: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.1  # λ of the proportional term's error filter
    rate: Annotated[float, Field(gt=0.0, le=100.0)] = 0.7  # the most |u| may grow in one step
    u_max: Annotated[float, Field(gt=0.0, le=100.0)] = 1.0  # the raising side's clip
    u_min: Annotated[float, Field(ge=0.0, le=100.0)] = 1.0  # the lowering side's clip (u ≥ −u_min)
    span_up: Annotated[float, Field(ge=0.0, le=1000.0)] = 1.0  # α per unit u
    span_down: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0  # κ per unit −u
    open_loop: Schedule | None = None

    @model_validator(mode="before")
    @classmethod
    def _floor_target(cls, data: Any) -> Any:
        """Mode floor without a target: FLOOR × H₀, just above the collapse line (contract/stability.py)."""
        if isinstance(data, dict) and data.get("mode") == "floor" and "target_entropy" not in data:
            return {**data, "target_entropy": {"relative": FLOOR}}
        return data

    @model_validator(mode="after")
    def _weights_stay_non_negative(self) -> SplitSettings:
        if self.span_down * self.u_min > 1.0:
            raise ValueError(
                f"span_down × u_min must be ≤ 1 (a confident token's weight 1 − κ stays ≥ 0), got "
                f"{self.span_down} × {self.u_min}"
            )
        if self.open_loop is not None and [s for s, _ in self.open_loop] != sorted(
            s for s, _ in self.open_loop
        ):
            raise ValueError("open_loop's steps must increase")
        return self

    def check_resolved(self) -> SplitSettings:
        if not self.nats > 0:
            raise ValueError("target_entropy must be > 0 for entropy_split (its error is relative to it)")
        return self

    def output_at(self, step: int) -> float | None:
        """The open-loop output at (1-based) `step`, or None when the law is closed."""
        if self.open_loop is None:
            return None
        value = 0.0
        for start, u in self.open_loop:
            if step >= start:
                value = u
        return value

    def actuators(self, u: float) -> tuple[float, float]:
        """(α, κ) for output u: split range, both 0 at u = 0."""
        return self.span_up * max(u, 0.0), min(self.span_down * max(-u, 0.0), 1.0)


@dataclass(frozen=True)
class SplitLossParams(ClipLossParams):
    """entropy_split's loss: grpo_ds's, and the confidence threshold of the lowering actuator."""

    # A token is confident when π_old gives it at least this probability. Not EntroPIC's 0.95: on SmolLM2 the
    # tokens above 0.95 carry about 1 % of the batch's first-order entropy sensitivity, too little to lower
    # anything (docs/ALGORITHMS.md §12.2); above 0.5 the sampled token is the policy's clear preference.
    p_conf: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.p_conf, bool) or not (
            isinstance(self.p_conf, int | float) and 0 < self.p_conf < 1
        ):
            raise ValueError(f"p_conf must be in (0, 1), got {self.p_conf!r}")


@dataclass(frozen=True)
class SplitState(ControlState):
    """What entropy_split keeps between steps (saved in checkpoints)."""

    integral: float = 0.0  # I
    output: float = 0.0  # u of the last step
    error: float = 0.0  # e of the last step
    filtered: float | None = None  # e_f (None before the first measurement)
    saturated_steps: int = 0  # consecutive steps, up to the last one, with u at a clip
    rate_limited: bool = False  # the last step's u was held by the rate limit
    armed: bool = False  # the entropy has reached the target once: the lowering side may act
    updates: int = 0
    bonus: float = 0.0  # α the loss reads (raising side)
    sharpen: float = 0.0  # κ the loss reads (lowering side)

    def bounds(self) -> None:
        if self.bonus < 0 or not 0 <= self.sharpen <= 1:
            raise ValueError(f"bonus must be ≥ 0 and sharpen in [0, 1], got {self.bonus!r}, {self.sharpen!r}")

    @property
    def saturated(self) -> bool:
        return self.saturated_steps > 0

    @property
    def actuator(self) -> float:
        return self.bonus - self.sharpen


def split_step(state: SplitState, batch_entropy: float, p: SplitSettings) -> SplitState:
    """One step of the law (module docstring). A non-finite H̄ leaves the state unchanged."""
    if not math.isfinite(batch_entropy):
        return state
    target = p.nats
    error = (target - batch_entropy) / target
    filtered = error if state.filtered is None else p.filter * state.filtered + (1.0 - p.filter) * error
    state = replace(state, armed=state.armed or filtered >= 0)
    fixed = p.output_at(state.updates + 1)
    if fixed is not None:
        output, integral, held = fixed, state.integral, False
    elif p.mode == "floor" and filtered <= 0:
        # Above the floor: no output, and the integral only unwinds (never below 0, never winds up here).
        output, integral, held = 0.0, max(0.0, state.integral + error), False
    else:
        output, integral, held = _pi(state, error, filtered, p)
    bonus, sharpen = p.actuators(output)
    at_clip = output >= p.u_max or (p.mode == "hold" and output <= -p.u_min)
    return replace(
        state,
        integral=integral,
        output=output,
        error=error,
        filtered=filtered,
        saturated_steps=state.saturated_steps + 1 if at_clip else 0,
        rate_limited=held,
        updates=state.updates + 1,
        bonus=bonus,
        sharpen=sharpen,
    )


def _pi(state: SplitState, error: float, filtered: float, p: SplitSettings) -> tuple[float, float, bool]:
    """(u, I, rate-limited) of the closed law, with conditional integration at every limit."""
    clip_low = -p.u_min if p.mode == "hold" and state.armed else 0.0
    # The rate limit holds how fast actuation builds up, away from 0 on either side; backing off toward 0 is
    # never held (a release that waited on the rate limit would overshoot through the plant's lag).
    low = max(clip_low, min(state.output, 0.0) - p.rate)
    high = min(p.u_max, max(state.output, 0.0) + p.rate)
    integral = state.integral + error
    if p.mode == "floor":
        integral = max(0.0, integral)
    raw = p.kp * filtered + p.ki * integral
    output = min(max(raw, low), high)
    if output != raw and error * (raw - output) > 0:  # held at a limit that the error pushes past
        integral = state.integral
        raw = p.kp * filtered + p.ki * integral
        output = min(max(raw, low), high)
    by_rate = (output == high and high < p.u_max) or (output == low and low > clip_low)
    return output, integral, by_rate and output != raw


_J, _R = Surface.JOB_VIEW, Surface.REPORT
FILTERED = "control/filtered_error"
BONUS = "control/bonus"
SHARPEN = "control/sharpen"
RATE_LIMITED = "control/rate_limited"
METRICS = (
    *LAW_METRICS,
    metric(
        FILTERED,
        "fraction",
        "e_f, the filtered error the proportional term reads (entropy_split).",
        shown=[_R],
        applies_to=NAME,
    ),
    metric(
        BONUS,
        "coefficient",
        "α, the entropy bonus the law applies (entropy_split; 0 when u ≤ 0).",
        shown=[_J, _R],
        applies_to=NAME,
    ),
    metric(
        SHARPEN,
        "weight",
        "κ, the confident-token weight the law applies (entropy_split; 0 when u ≥ 0).",
        shown=[_J, _R],
        applies_to=NAME,
    ),
    metric(
        RATE_LIMITED,
        "flag",
        "1 when the rate limit held the output this step (entropy_split).",
        applies_to=NAME,
    ),
)


def _read(state: SplitState, p: SplitSettings) -> dict[str, float]:
    values = pi_read(NAME)(state, p)
    values.update(
        {
            FILTERED: state.filtered if state.filtered is not None else 0.0,
            BONUS: state.bonus,
            SHARPEN: state.sharpen,
            RATE_LIMITED: float(state.rate_limited),
        }
    )
    return values


def _step(state: SplitState, h: float, p: SplitSettings, loss_params: Any) -> SplitState:
    return split_step(state, h, p)


ENTROPY_SPLIT = Controller(
    NAME,
    SplitSettings,
    SplitState,
    initial=lambda p, loss_params: SplitState(),
    step=_step,
    read=_read,
    metrics=METRICS,
    own_algorithm=OwnAlgorithm(SplitLossParams, zero_advantage_inert=True, differentiable_entropy=True),
    closed_loop=True,
)
assert {OUTPUT, SATURATED_STEPS} <= ENTROPY_SPLIT.metric_keys
