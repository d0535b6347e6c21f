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

from trainer.hyperparams import StareGateParams


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
