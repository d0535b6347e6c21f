"""STARE's target-entropy gate and adaptive W/M schedule (STARE, official code semantics, ALGORITHMS §5).

Once per optimiser step, before the update, the loop measures H̄ (token-mean entropy of π_old over the
filtered training batch) and calls `update`:
- gate_on = H̄ < H_tgt (strict; off at equality). No band, no gain, no hysteresis.
- adaptive (off by default): W ← clip(W + α·sgn(H_tgt − H̄), 1, w_max), M ← clip(M − α·sgn(H_tgt − H̄), m_min, 1).
- a non-finite H̄ leaves the state unchanged; before any measurement the gate is on.
The state is a frozen dataclass so the loop can save and restore it exactly (checkpoints).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class StareGateParams:
    target_entropy: float = 0.3
    reweight_w: float = 1.1
    reweight_m: float = 0.9
    adaptive: bool = False
    alpha: float = 0.01
    w_max: float = 1.5
    m_min: float = 0.5

    def __post_init__(self) -> None:
        if not math.isfinite(self.target_entropy) or self.target_entropy < 0:
            raise ValueError(
                f"target_entropy must be a finite non-negative number, got {self.target_entropy!r}"
            )
        if not (self.reweight_w >= 1.0) or not math.isfinite(self.reweight_w):
            raise ValueError(f"reweight_w (W) must be ≥ 1, got {self.reweight_w!r}")
        if not (0.0 < self.reweight_m <= 1.0):
            raise ValueError(f"reweight_m (M) must be in (0, 1], got {self.reweight_m!r}")
        if not (self.alpha >= 0.0) or not math.isfinite(self.alpha):
            raise ValueError(f"alpha must be ≥ 0, got {self.alpha!r}")
        if not (self.w_max >= 1.0) or not math.isfinite(self.w_max):
            raise ValueError(f"w_max must be ≥ 1, got {self.w_max!r}")
        if not (0.0 < self.m_min <= 1.0):
            raise ValueError(f"m_min must be in (0, 1], got {self.m_min!r}")


@dataclass(frozen=True)
class StareControllerState:
    gate_on: bool
    reweight_w: float
    reweight_m: float
    batch_entropy: float | None = None  # last finite H̄ measured
    updates: int = 0  # finite measurements applied

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StareControllerState:
        return cls(**data)


def initial_state(params: StareGateParams) -> StareControllerState:
    return StareControllerState(gate_on=True, reweight_w=params.reweight_w, reweight_m=params.reweight_m)


def _sign(x: float) -> float:
    return float((x > 0) - (x < 0))


def update(
    state: StareControllerState, batch_entropy: float, params: StareGateParams
) -> StareControllerState:
    if not math.isfinite(batch_entropy):
        return state
    gate_on = batch_entropy < params.target_entropy
    w, m = state.reweight_w, state.reweight_m
    if params.adaptive:
        direction = _sign(params.target_entropy - batch_entropy)
        w = min(max(w + params.alpha * direction, 1.0), params.w_max)
        m = min(max(m - params.alpha * direction, params.m_min), 1.0)
    return replace(
        state,
        gate_on=gate_on,
        reweight_w=w,
        reweight_m=m,
        batch_entropy=float(batch_entropy),
        updates=state.updates + 1,
    )
