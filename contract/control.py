"""The PI entropy laws, torch-free: their settings, their state and the law itself (docs/ALGORITHMS.md §11).

Once per optimiser step, before the update, from H̄ (token-mean entropy of π_old over the step batch):

    H_s   = H̄                               (smoothing 0), or λ·H_s + (1 − λ)·H̄ (λ = smoothing, EMA)
    e     = (H* − H_s) / H*                  relative shortfall: > 0 below the target, so one default fits
                                             a target of 0.3 nats and one of 2 nats
    v     = Kp·e + Ki·(I + e)                the unclipped output
    u     = clip(v, −u_min, u_max)           the output; u > 0 raises entropy, u < 0 lowers it (the
                                             lowering side has less authority: see u_min)
    I    ← I + e  unless u is saturated and e pushes it further out (conditional integration: the
                  integral never grows while the actuator sits at its clip in the error's direction)

The actuator turns u into what the loss reads (trainer/algos/pi_control.py):
- `entropy_pi`: the bonus coefficient α = span·u, loss = grpo_ds − α·H_t (α < 0 sharpens);
- `stare_pi`: STARE's weights, W = 1 + span·u on L⁺ for u ≥ 0 and W = 1 + (1 − w_floor)·u for u < 0
  (down-weighting), and for C2 M = 1 − (1 − m_min)·u on L⁻ (M > 1 for u < 0, the mirror side);
- `clip_pi`: clip-higher's ε_high = clip_high + span·u (clip_high: the loss's own, the centre).

Default gains come from pole placement on the first-order plant ln H̄_{k+1} = ln H̄_k − δ + β·a_k, with
B = β·span the plant's response to u = 1 (per step, relative): both closed-loop poles at p gives
Kp = (1 − p²)/B and Ki = (1 − p)²/B (`pole_placement`). The measured δ and β: experiments/plant.py.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from contract.hyperparams import (
    DEFAULT_TARGET_ENTROPY,
    STARE_SCOPES,
    STARE_VARIANTS,
    ClipLossParams,
    StareParams,
    check_target_entropy,
)
from contract.control_split import SplitControl

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


@dataclass(frozen=True)
class PiControlParams:
    """A PI law's settings (algorithm.control), target resolved. Subclasses set the actuator's defaults."""

    target_entropy: float = DEFAULT_TARGET_ENTROPY  # H* (nats), resolved
    kp: float = pole_placement(ENTROPY_PI_RESPONSE)[0]
    ki: float = pole_placement(ENTROPY_PI_RESPONSE)[1]
    u_max: float = 1.0  # u ≤ u_max (the raising side)
    # u ≥ −u_min (the lowering side). Small by default: the plant is not symmetric. Pushing entropy down (a
    # negative bonus, W < 1) feeds the policy's own collapse, and on the tuning cell's first runs u = −1 at
    # the first step (H₀ is 1/0.7 × the target) took entropy from 0.9 to 0.16 nats in two steps; the drift
    # of RL already lowers entropy, so the lowering side only needs to trim an overshoot (§11.3).
    u_min: float = 0.1
    smoothing: float = 0.0  # λ of the EMA on H̄ (0: the raw H̄)
    span: float = 0.55  # the actuator's value per unit u (α for entropy_pi)

    def __post_init__(self) -> None:
        check_target_entropy(self.target_entropy)
        if not self.target_entropy > 0:
            raise ValueError("target_entropy must be > 0 for a PI law (its error is relative to it)")
        for name in ("kp", "ki", "u_max", "u_min", "span"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int | float) and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"{name} must be ≥ 0, got {value!r}")
        if not self.u_max > 0:
            raise ValueError(f"u_max must be > 0, got {self.u_max!r}")
        if not 0.0 <= self.smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {self.smoothing!r}")


@dataclass(frozen=True)
class EntropyPiControl(PiControlParams):
    """entropy_pi: α = span·u, the bonus coefficient, either sign."""


@dataclass(frozen=True)
class StarePiControl(PiControlParams):
    """stare_pi: W = 1 + span·u (u ≥ 0), 1 + (1 − w_floor)·u (u < 0); C2: M = 1 − (1 − m_min)·u."""

    kp: float = pole_placement(STARE_PI_RESPONSE)[0]
    ki: float = pole_placement(STARE_PI_RESPONSE)[1]
    span: float = 9.0
    w_floor: float = 0.1
    m_min: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.w_floor <= 1.0:
            raise ValueError(f"w_floor must be in (0, 1], got {self.w_floor!r}")
        if not 0.0 < self.m_min <= 1.0:
            raise ValueError(f"m_min must be in (0, 1], got {self.m_min!r}")
        if self.u_max > 1.0:
            raise ValueError(f"u_max must be ≤ 1 for stare_pi (W stays > 0), got {self.u_max!r}")
        if self.u_min > 1.0:
            raise ValueError(f"u_min must be ≤ 1 for stare_pi (W stays > 0), got {self.u_min!r}")


@dataclass(frozen=True)
class ClipPiControl(PiControlParams):
    """clip_pi: ε_high = clip_high + span·u, kept ≥ 0."""

    kp: float = pole_placement(CLIP_PI_RESPONSE)[0]
    ki: float = pole_placement(CLIP_PI_RESPONSE)[1]
    span: float = 0.2


@dataclass(frozen=True)
class PiState:
    """What a PI law keeps between steps (saved in checkpoints)."""

    integral: float = 0.0  # I: the sum of the errors integrated so far
    output: float = 0.0  # u of the last step
    error: float = 0.0  # e of the last step
    smoothed: float | None = None  # H_s (None before any measurement)
    saturated_steps: int = 0  # consecutive steps, up to the last one, with u at a clip (u_max or −u_min)
    updates: int = 0
    # What the loss reads, set by the controller from u (trainer/algos/pi_control.py): α, W or ε_high;
    # actuator_m: M (stare_pi, C2). None: the loss's value at u = 0.
    actuator: float | None = None
    actuator_m: float | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        for name in ("integral", "output", "error"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int | float) and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        for name in ("smoothed", "actuator", "actuator_m"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and math.isfinite(value)):
                raise ValueError(f"{name} must be finite or None, got {value!r}")
        if self.saturated_steps < 0 or self.updates < 0:
            raise ValueError("saturated_steps and updates must be ≥ 0")

    @property
    def saturated(self) -> bool:
        return self.saturated_steps > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PiState:
        return cls(**data)


def pi_step(state: PiState, batch_entropy: float, p: PiControlParams) -> PiState:
    """One step of the law (module docstring). A non-finite H̄ leaves the state unchanged."""
    if not math.isfinite(batch_entropy):
        return state
    smoothed = (
        batch_entropy
        if state.smoothed is None or p.smoothing == 0
        else p.smoothing * state.smoothed + (1.0 - p.smoothing) * batch_entropy
    )
    error = (p.target_entropy - smoothed) / p.target_entropy
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


# The laws, by controller name: their settings class. The algorithm a job gets when it sets
# algorithm.control and names no algorithm: DEFAULT_LAW (docs/ALGORITHMS.md §11.4).
LAW_SETTINGS: dict[str, type[Any]] = {
    "entropy_pi": EntropyPiControl,
    "stare_pi": StarePiControl,
    "clip_pi": ClipPiControl,
    "entropy_split": SplitControl,
}
DEFAULT_LAW = "entropy_pi"


def law_settings(law: str, target_entropy: float, overrides: dict[str, Any]) -> PiControlParams:
    """The settings of `law` with the spec's overrides (None values: the law's default)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    settings_cls = LAW_SETTINGS[law]
    known = {f.name for f in dataclasses.fields(settings_cls)}
    for name in sorted(set(given) - known):
        raise ValueError(f"{name} is not a setting of {law}; its settings: {', '.join(sorted(known))}")
    return settings_cls(target_entropy=target_entropy, **given)
