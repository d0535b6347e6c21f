"""The first-generation PI entropy laws (docs/ALGORITHMS.md §11), declared: `entropy_pi`, `stare_pi` and
`clip_pi`, one law with three actuators.

Once per optimiser step, before the update, from H̄ (token-mean entropy of π_old over the step batch):

    H_s   = H̄                               (smoothing 0), or λ·H_s + (1 − λ)·H̄ (λ = smoothing, EMA)
    e     = (H* − H_s) / H*                  relative shortfall: > 0 below the target, so one default fits
                                             a target of 0.3 nats and one of 2 nats
    v     = Kp·e + Ki·(I + e)                the unclipped output
    u     = clip(v, −u_min, u_max)           the output; u > 0 raises entropy, u < 0 lowers it (the
                                             lowering side has less authority: see u_min)
    I    ← I + e  unless u is saturated and e pushes it further out (conditional integration: the
                  integral never grows while the actuator sits at its clip in the error's direction)

The actuator's value the loss reads (trainer/algos/pi_control.py applies it):
- `entropy_pi`: the bonus coefficient α = span·u, loss = grpo_ds − α·H_t (α < 0 sharpens);
- `stare_pi`: STARE's weights, W = 1 + span·u on L⁺ for u ≥ 0 and W = 1 + (1 − w_floor)·u for u < 0
  (down-weighting), and for C2 M = 1 − (1 − m_min)·u on L⁻ (M > 1 for u < 0, the mirror side);
- `clip_pi`: clip-higher's ε_high = clip_high + span·u (clip_high: the loss's own, the centre).

Default gains come from pole placement on the first-order plant ln H̄_{k+1} = ln H̄_k − δ + β·a_k, with
B = β·span the plant's response to u = 1 (per step, relative): both closed-loop poles at p gives
Kp = (1 − p²)/B and Ki = (1 − p)²/B (`pole_placement`). The measured δ and β: experiments/plant.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from contract.control.base import Controller, ControlSettings, ControlState, OwnAlgorithm
from contract.hyperparams import STARE_SCOPES, STARE_VARIANTS, ClipLossParams, StareParams
from contract.metrics_types import Surface, metric

# The design: both poles at POLE (5 % settling in about 15 steps, no overshoot of the linear loop). 0.8, not
# the first design's 0.7: on the tuning cell's first runs the batch entropy's step-to-step noise (σ ≈ 0.2–0.3
# relative at 4 × 8 samples) went through Kp = 3.4 as ±0.7 of output; 0.8 cuts Kp to 2.4 (§11.3).
POLE = 0.8


def pole_placement(response: float, pole: float = POLE) -> tuple[float, float]:
    """(Kp, Ki), to 4 decimals, placing both poles of the discrete PI loop on the plant e_{k+1} = e_k + δ − B·u_k at
    `pole`: the characteristic polynomial z² + (B·Kp + B·Ki − 2)·z + (1 − B·Kp) = (z − pole)²."""
    if not (response > 0 and math.isfinite(response)) or not 0.0 <= pole < 1.0:
        raise ValueError(f"pole placement needs a response > 0 and a pole in [0, 1), got {response}, {pole}")
    return round((1.0 - pole * pole) / response, 4), round((1.0 - pole) ** 2 / response, 4)


# The plant's response to u = 1 (relative entropy change per step) each law's default span is sized for,
# measured on the SmolLM2 suite (docs/ALGORITHMS.md §11.2): β·span at the geometric mean of the two
# learning rates' β. STARE's W cannot reach the bonus's authority within a sane W (β_W ≈ 0.007 per unit).
ENTROPY_PI_RESPONSE = 0.15  # β_α ≈ 0.27 per unit α × span 0.55
STARE_PI_RESPONSE = 0.065  # β_W ≈ 0.0072 per unit W − 1 × span 9
CLIP_PI_RESPONSE = 0.15  # not measured (no suite run moves ε_high): the bonus's, assumed

Gain = Annotated[float, Field(ge=0.0, le=1000.0)]


class PiSettings(ControlSettings):
    """A PI law's settings (algorithm.control). The subclasses set the actuator's defaults."""

    kp: Gain = pole_placement(ENTROPY_PI_RESPONSE)[0]
    ki: Gain = pole_placement(ENTROPY_PI_RESPONSE)[1]
    u_max: Annotated[float, Field(gt=0.0, le=100.0)] = 1.0  # u ≤ u_max (the raising side)
    # u ≥ −u_min (the lowering side). Small by default: the plant is not symmetric. Pushing entropy down (a
    # negative bonus, W < 1) feeds the policy's own collapse, and on the tuning cell's first runs u = −1 at
    # the first step (H₀ is 1/0.7 × the target) took entropy from 0.9 to 0.16 nats in two steps; the drift
    # of RL already lowers entropy, so the lowering side only needs to trim an overshoot (§11.3).
    u_min: Annotated[float, Field(ge=0.0, le=100.0)] = 0.1
    smoothing: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0  # λ of the EMA on H̄ (0: the raw H̄)
    span: Gain = 0.55  # the actuator's value per unit u (α for entropy_pi)

    def check_resolved(self) -> PiSettings:
        if not self.nats > 0:
            raise ValueError("target_entropy must be > 0 for a PI law (its error is relative to it)")
        return self


class EntropyPiSettings(PiSettings):
    """entropy_pi: α = span·u, the bonus coefficient, either sign."""

    controller: Literal["entropy_pi"] = "entropy_pi"


class StarePiSettings(PiSettings):
    """stare_pi: W = 1 + span·u (u ≥ 0), 1 + (1 − w_floor)·u (u < 0); C2: M = 1 − (1 − m_min)·u."""

    controller: Literal["stare_pi"] = "stare_pi"
    kp: Gain = pole_placement(STARE_PI_RESPONSE)[0]
    ki: Gain = pole_placement(STARE_PI_RESPONSE)[1]
    span: Gain = 9.0
    w_floor: Annotated[float, Field(gt=0.0, le=1.0)] = 0.1
    m_min: Annotated[float, Field(gt=0.0, le=1.0)] = 0.5

    @model_validator(mode="after")
    def _weights_stay_positive(self) -> StarePiSettings:
        if self.u_max > 1.0:
            raise ValueError(f"u_max must be ≤ 1 for stare_pi (W stays > 0), got {self.u_max!r}")
        if self.u_min > 1.0:
            raise ValueError(f"u_min must be ≤ 1 for stare_pi (W stays > 0), got {self.u_min!r}")
        return self


class ClipPiSettings(PiSettings):
    """clip_pi: ε_high = clip_high + span·u, kept ≥ 0."""

    controller: Literal["clip_pi"] = "clip_pi"
    kp: Gain = pole_placement(CLIP_PI_RESPONSE)[0]
    ki: Gain = pole_placement(CLIP_PI_RESPONSE)[1]
    span: Gain = 0.2


@dataclass(frozen=True)
class PiState(ControlState):
    """What a PI law keeps between steps (saved in checkpoints)."""

    integral: float = 0.0  # I: the sum of the errors integrated so far
    output: float = 0.0  # u of the last step
    error: float = 0.0  # e of the last step
    smoothed: float | None = None  # H_s (None before any measurement)
    saturated_steps: int = 0  # consecutive steps, up to the last one, with u at a clip (u_max or −u_min)
    updates: int = 0
    # What the loss reads, set from u by the law's actuator map (`actuator_values`): α, W or ε_high;
    # actuator_m: M (stare_pi, C2). None: the loss's value at u = 0.
    actuator: float | None = None
    actuator_m: float | None = None

    @property
    def saturated(self) -> bool:
        return self.saturated_steps > 0


def pi_step(state: PiState, batch_entropy: float, p: PiSettings) -> PiState:
    """One step of the law (module docstring). A non-finite H̄ leaves the state unchanged."""
    if not math.isfinite(batch_entropy):
        return state
    target = p.nats
    smoothed = (
        batch_entropy
        if state.smoothed is None or p.smoothing == 0
        else p.smoothing * state.smoothed + (1.0 - p.smoothing) * batch_entropy
    )
    error = (target - smoothed) / target
    integral = state.integral + error
    raw = p.kp * error + p.ki * integral
    output = min(max(raw, -p.u_min), p.u_max)
    saturated = output != raw
    if saturated and error * raw > 0:  # the actuator is at its clip and the error would push it further
        integral = state.integral
        output = min(max(p.kp * error + p.ki * integral, -p.u_min), p.u_max)
    at_clip = output >= p.u_max or output <= -p.u_min
    return replace(
        state,
        integral=integral,
        output=output,
        error=error,
        smoothed=smoothed,
        saturated_steps=state.saturated_steps + 1 if at_clip else 0,
        updates=state.updates + 1,
    )


@dataclass(frozen=True)
class StarePiParams(ClipLossParams):
    """stare_pi's loss: STARE's selection (P, variant, scope) with W and M set by the PI law each step."""

    top_ratio: float = StareParams.top_ratio  # P
    variant: Literal["O1", "C2"] = "O1"
    scope: Literal["micro_batch", "step_batch"] = "micro_batch"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (isinstance(self.top_ratio, int | float) and 0.0 <= self.top_ratio <= 1.0):
            raise ValueError(f"top_ratio (P) must be in [0, 1], got {self.top_ratio!r}")
        if self.variant not in STARE_VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(STARE_VARIANTS)}, got {self.variant!r}")
        if self.scope not in STARE_SCOPES:
            raise ValueError(f"scope must be one of {', '.join(STARE_SCOPES)}, got {self.scope!r}")


# ------------------------------------------------------------------------------------------ actuator maps


def stare_pi_weights(u: float, p: StarePiSettings) -> tuple[float, float]:
    """(W, M) for output u: W = 1 + span·u (u ≥ 0) or 1 + (1 − w_floor)·u (u < 0); M = 1 − (1 − m_min)·u."""
    w = 1.0 + (p.span * u if u >= 0 else (1.0 - p.w_floor) * u)
    m = 1.0 - (1.0 - p.m_min) * u
    return w, m


def clip_high_of(u: float, span: float, centre: float) -> float:
    return max(0.0, centre + span * u)


def actuator_values(name: str, u: float, p: PiSettings, loss_params: Any) -> tuple[float, float | None]:
    """(the actuator's value, M or None) the loss reads for output u."""
    if name == "stare_pi":
        assert isinstance(p, StarePiSettings)
        return stare_pi_weights(u, p)
    if name == "clip_pi":
        centre = getattr(loss_params, "clip_high", ClipLossParams.clip_high)
        return clip_high_of(u, p.span, centre), None
    return p.span * u, None


# ------------------------------------------------------------------------------------------ metrics

LAWS = "entropy_pi, stare_pi, clip_pi, entropy_split"
OUTPUT = "control/output"
ERROR = "control/error"
INTEGRAL = "control/integral"
SATURATED = "control/saturated"
SATURATED_STEPS = "control/saturated_steps"
ACTUATOR = "control/actuator"
TARGET = "control/target_entropy"
# Consecutive steps at the clip from which the target counts as not holdable with the actuator: the
# ControllerSaturated alert (deploy/prometheus/alerts.yml), the job view's and the report's `saturated`.
# At the raising clip (u = u_max > 0) 20 steps. At the lowering clip (u = −u_min) LOWERING_ALERT_STEPS: that
# side is small by design (u_min = 0.1) and leaves the lowering to the policy's own drift, so the law sits
# there on every approach from H₀ down to a target below it (21–27 steps on the tiny model, results/control);
# 50 steps there means the drift is not bringing entropy down either.
SATURATION_ALERT_STEPS = 20
LOWERING_ALERT_STEPS = 50


def saturation_alert(steps: float | None, output: float | None) -> bool:
    """Whether `steps` consecutive steps at the clip, with the law's output `output` (its sign says which
    clip; unknown: the raising side's count applies), mean the target cannot be held."""
    if steps is None:
        return False
    if output is not None and output < 0:
        return steps >= LOWERING_ALERT_STEPS
    return steps >= SATURATION_ALERT_STEPS


_J, _R = Surface.JOB_VIEW, Surface.REPORT
LAW_METRICS = (
    metric(
        OUTPUT,
        "output",
        "u, the law's output this step (in [−u_min, u_max]; > 0 raises entropy, < 0 lowers it).",
        prometheus="stare_job_control_output",
        shown=[_J, _R],
        applies_to=LAWS,
    ),
    metric(
        ERROR,
        "fraction",
        "e = (H* − H_s)/H*, the relative shortfall of the (smoothed) batch entropy from the target.",
        prometheus="stare_job_control_error",
        shown=[_J, _R],
        applies_to=LAWS,
    ),
    metric(
        INTEGRAL,
        "fraction·steps",
        "I, the integrated error (not grown while the output sits at a limit in the error's direction).",
        prometheus="stare_job_control_integral",
        shown=[_J, _R],
        applies_to=LAWS,
    ),
    metric(
        SATURATED,
        "flag",
        "1 when the output sits at a clip (u = u_max or u = −u_min) this step.",
        shown=[_J],
        applies_to=LAWS,
    ),
    metric(
        SATURATED_STEPS,
        "steps",
        "Consecutive steps, up to this one, with the output at its clip; 20 or more at the raising clip, 50 "
        "or more at the lowering one: the target cannot be held with this actuator (alert "
        "ControllerSaturated).",
        prometheus="stare_job_control_saturated_steps",
        prometheus_help="Consecutive steps with the PI law's output at its clip.",
        shown=[_J, _R],
        applies_to=LAWS,
    ),
    metric(
        ACTUATOR,
        "value",
        "What the output sets: the bonus coefficient α (entropy_pi), W (stare_pi), ε_high (clip_pi), or "
        "α − κ (entropy_split: the bonus, or minus the confident-token weight).",
        prometheus="stare_job_control_actuator",
        shown=[_J, _R],
        applies_to=LAWS,
    ),
    metric(
        TARGET,
        "nats",
        "H*, the law's target (algorithm.control.target_entropy, resolved).",
        shown=[_J],
        applies_to=LAWS,
    ),
)


def read(name: str) -> Any:
    def values(state: PiState, p: PiSettings) -> dict[str, float]:
        return {
            OUTPUT: state.output,
            ERROR: state.error,
            INTEGRAL: state.integral,
            SATURATED: float(state.saturated),
            SATURATED_STEPS: float(state.saturated_steps),
            ACTUATOR: state.actuator if state.actuator is not None else 0.0,
            TARGET: p.nats,
        }

    return values


def _law(name: str, settings: type[PiSettings], params_cls: type[ClipLossParams], inert: bool) -> Controller:
    def actuate(state: PiState, p: PiSettings, loss_params: Any) -> PiState:
        value, m = actuator_values(name, state.output, p, loss_params)
        return replace(state, actuator=value, actuator_m=m)

    def step(state: PiState, h: float, p: PiSettings, loss_params: Any) -> PiState:
        return actuate(pi_step(state, h, p), p, loss_params)

    return Controller(
        name,
        settings,
        PiState,
        initial=lambda p, loss_params: actuate(PiState(), p, loss_params),
        step=step,
        read=read(name),
        metrics=LAW_METRICS,
        needs_off_policy=name == "clip_pi",
        own_algorithm=OwnAlgorithm(params_cls, zero_advantage_inert=inert, differentiable_entropy=not inert),
        closed_loop=True,
    )


ENTROPY_PI = _law("entropy_pi", EntropyPiSettings, ClipLossParams, inert=False)
STARE_PI = _law("stare_pi", StarePiSettings, StarePiParams, inert=True)
CLIP_PI = _law("clip_pi", ClipPiSettings, ClipLossParams, inert=True)
