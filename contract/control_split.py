"""The second-generation entropy law, `entropy_split`: one damped PI law driving two actuators in split range
(docs/ALGORITHMS.md §12). Torch-free: its settings, its state and its pure step.

Once per optimiser step, before the update, from H̄ (the token-mean entropy of π_old over the step batch):

    e    = (H* − H̄) / H*                    relative shortfall (> 0 below the target)
    e_f  = λ·e_f + (1 − λ)·e                 the filtered error, for the proportional term only
    v    = Kp·e_f + Ki·(I + e)               the integral runs on the raw error (no lag in it)
    u    = clip(clip(v, −u_min, u_max), u_prev − r, u_prev + r)     the output, clipped, then rate-limited
    I   ← I + e unless u is held at a limit (a clip or the rate) that e pushes v further past
          (conditional integration: anti-windup of both actuators and of the rate limit)

The output drives one of two actuators (split range; both are 0 at u = 0, so crossing 0 is bumpless):
- u > 0, raising: the entropy bonus α = span_up·u, loss − α·H_t on the tokens of rows with Â ≠ 0;
- u < 0, lowering: confident-token sharpening κ = span_down·(−u): on tokens that π_old already gives
  p ≥ p_conf, the per-token surrogate is weighted 1 + κ·sign(Â). It sharpens only what the policy is already
  sure of, never the forking tokens (p < p_conf), so it cannot drive the collapse the way a negative bonus
  does (trainer/algos/split_control.py).

Mode `floor`: the target is a floor. The law acts only below it: while the filtered entropy is above the
floor the output is 0 and the integral only unwinds (it never goes below 0), and the lowering actuator is
never used. Mode `hold` (the default): two-sided around the target.

`open_loop`: a fixed output schedule [[from_step, u], …] instead of the law, for measuring the plant's
step responses (experiments/plant.py); the state still records e and H̄.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from contract.hyperparams import DEFAULT_TARGET_ENTROPY, ClipLossParams, check_target_entropy

SPLIT_MODES = ("hold", "floor")


def _finite_nonneg(name: str, value: Any) -> None:
    if isinstance(value, bool) or not (isinstance(value, int | float) and math.isfinite(value)) or value < 0:
        raise ValueError(f"{name} must be a finite number ≥ 0, got {value!r}")


@dataclass(frozen=True)
class SplitControl:
    """entropy_split's settings (algorithm.control), target resolved."""

    target_entropy: float = DEFAULT_TARGET_ENTROPY  # H* (nats), resolved; the floor in mode floor
    mode: Literal["hold", "floor"] = "hold"
    kp: float = 1.0
    ki: float = 0.15
    filter: float = 0.6  # λ of the proportional term's error filter (0: the raw error)
    rate: float = 0.25  # the most u may move in one step
    u_max: float = 1.0  # the raising side's clip
    u_min: float = 1.0  # the lowering side's clip (u ≥ −u_min)
    span_up: float = 0.5  # α per unit u
    span_down: float = 0.5  # κ per unit −u (κ ≤ 1 keeps every weight ≥ 0)
    open_loop: tuple[tuple[int, float], ...] | None = None

    def __post_init__(self) -> None:
        check_target_entropy(self.target_entropy)
        if not self.target_entropy > 0:
            raise ValueError("target_entropy must be > 0 for entropy_split (its error is relative to it)")
        if self.mode not in SPLIT_MODES:
            raise ValueError(f"mode must be one of {', '.join(SPLIT_MODES)}, got {self.mode!r}")
        for name in ("kp", "ki", "rate", "u_max", "u_min", "span_up", "span_down"):
            _finite_nonneg(name, getattr(self, name))
        if not 0.0 <= self.filter < 1.0:
            raise ValueError(f"filter must be in [0, 1), got {self.filter!r}")
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0, got {self.rate!r}")
        if self.span_down * self.u_min > 1.0:
            raise ValueError(
                f"span_down × u_min must be ≤ 1 (a confident token's weight 1 − κ stays ≥ 0), got "
                f"{self.span_down} × {self.u_min}"
            )
        if self.open_loop is not None:
            object.__setattr__(self, "open_loop", _schedule(self.open_loop))

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
        return self.span_up * max(u, 0.0), self.span_down * max(-u, 0.0)


def _schedule(value: Any) -> tuple[tuple[int, float], ...]:
    try:
        pairs = tuple((int(step), float(u)) for step, u in value)
    except (TypeError, ValueError):
        raise ValueError(f"open_loop must be a list of [from_step, u] pairs, got {value!r}") from None
    if not pairs or any(s < 1 or not math.isfinite(u) or abs(u) > 1.0 for s, u in pairs):
        raise ValueError(f"open_loop needs from_step ≥ 1 and |u| ≤ 1 in every pair, got {value!r}")
    if list(pairs) != sorted(pairs):
        raise ValueError(f"open_loop's steps must increase, got {value!r}")
    return pairs


@dataclass(frozen=True)
class SplitState:
    """What entropy_split keeps between steps (saved in checkpoints)."""

    integral: float = 0.0  # I
    output: float = 0.0  # u of the last step
    error: float = 0.0  # e of the last step
    filtered: float | None = None  # e_f (None before the first measurement)
    saturated_steps: int = 0  # consecutive steps, up to the last one, with u at a clip
    rate_limited: bool = False  # the last step's u was held by the rate limit
    updates: int = 0
    bonus: float = 0.0  # α the loss reads (raising side)
    sharpen: float = 0.0  # κ the loss reads (lowering side)

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        for name in ("integral", "output", "error", "bonus", "sharpen"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int | float) and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.filtered is not None and not math.isfinite(self.filtered):
            raise ValueError(f"filtered must be finite or None, got {self.filtered!r}")
        if self.bonus < 0 or self.sharpen < 0 or self.sharpen > 1:
            raise ValueError("bonus must be ≥ 0 and sharpen in [0, 1]")
        if self.saturated_steps < 0 or self.updates < 0:
            raise ValueError("saturated_steps and updates must be ≥ 0")

    @property
    def saturated(self) -> bool:
        return self.saturated_steps > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SplitState:
        return cls(**data)


def _limits(p: SplitControl, previous: float) -> tuple[float, float]:
    """The output's range this step: the clips, narrowed by the rate limit around the last output."""
    low = -p.u_min if p.mode == "hold" else 0.0
    return max(low, previous - p.rate), min(p.u_max, previous + p.rate)


def split_step(state: SplitState, batch_entropy: float, p: SplitControl) -> SplitState:
    """One step of the law (module docstring). A non-finite H̄ leaves the state unchanged."""
    if not math.isfinite(batch_entropy):
        return state
    error = (p.target_entropy - batch_entropy) / p.target_entropy
    filtered = error if state.filtered is None else p.filter * state.filtered + (1.0 - p.filter) * error
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
        sharpen=min(sharpen, 1.0),
    )


def _pi(state: SplitState, error: float, filtered: float, p: SplitControl) -> tuple[float, float, bool]:
    """(u, I, rate-limited) of the closed law, with conditional integration at every limit."""
    low, high = _limits(p, state.output)
    integral = state.integral + error
    if p.mode == "floor":
        integral = max(0.0, integral)
    raw = p.kp * filtered + p.ki * integral
    output = min(max(raw, low), high)
    if output != raw and error * (raw - output) > 0:  # held at a limit that the error pushes past
        integral = state.integral
        raw = p.kp * filtered + p.ki * integral
        output = min(max(raw, low), high)
    rate_limited = output in (state.output - p.rate, state.output + p.rate) and output != raw
    return output, integral, rate_limited


@dataclass(frozen=True)
class SplitLossParams(ClipLossParams):
    """entropy_split's loss: grpo_ds's, and the confidence threshold of the lowering actuator."""

    p_conf: float = 0.95  # a token is confident when π_old gives it at least this probability

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.p_conf, bool) or not (
            isinstance(self.p_conf, int | float) and 0.0 < self.p_conf < 1.0
        ):
            raise ValueError(f"p_conf must be in (0, 1), got {self.p_conf!r}")
