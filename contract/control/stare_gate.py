"""STARE's target-entropy gate and its optional adaptive W/M schedule (docs/ALGORITHMS.md §5), declared.

Once per optimiser step, before the update, from H̄ (the official code's semantics):

    gate_on = H̄ < H_tgt                                  strict: off at equality; no band, gain or hysteresis
    adaptive (off by default):  W ← clip(W + α·sgn(H_tgt − H̄), 1, w_max)
                                M ← clip(M − α·sgn(H_tgt − H̄), m_min, 1)

A non-finite H̄ leaves the state unchanged; before any measurement the gate is on, with W and M at the
loss's configured values (algorithm.params.reweight_w/reweight_m). The weights ω the state sets are the
loss's (trainer/algos/stare.py, the actuator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Annotated, Literal

from pydantic import Field

from contract.control.base import Controller, ControlSettings, ControlState
from contract.hyperparams import ClipLossParams, StareParams
from contract.metrics_types import Surface, metric

NAME = "stare_gate"


class StareGateSettings(ControlSettings):
    """algorithm.control for STARE (formerly algorithm.gate)."""

    controller: Literal["stare_gate"] = "stare_gate"
    adaptive: bool = False
    alpha: Annotated[float, Field(ge=0.0, le=1.0)] = 0.01
    w_max: Annotated[float, Field(ge=1.0, le=100.0)] = 1.5
    m_min: Annotated[float, Field(gt=0.0, le=1.0)] = 0.5


@dataclass(frozen=True)
class StareControllerState(ControlState):
    gate_on: bool
    reweight_w: float
    reweight_m: float
    batch_entropy: float | None = None  # last finite H̄ measured
    updates: int = 0  # finite measurements applied

    def bounds(self) -> None:
        """W ≥ 1 and M in (0, 1]."""
        if not self.reweight_w >= 1.0:
            raise ValueError(f"reweight_w (W) must be ≥ 1, got {self.reweight_w!r}")
        if not 0.0 < self.reweight_m <= 1.0:
            raise ValueError(f"reweight_m (M) must be in (0, 1], got {self.reweight_m!r}")


def initial_state(settings: StareGateSettings | None, loss_params: ClipLossParams) -> StareControllerState:
    """Before any measurement: the gate on, W and M at the loss's values (the defaults for a loss without
    them)."""
    return StareControllerState(
        gate_on=True,
        reweight_w=getattr(loss_params, "reweight_w", StareParams.reweight_w),
        reweight_m=getattr(loss_params, "reweight_m", StareParams.reweight_m),
    )


def _sign(x: float) -> float:
    return float((x > 0) - (x < 0))


def update(
    state: StareControllerState, batch_entropy: float, p: StareGateSettings, loss_params: object = None
) -> StareControllerState:
    if not math.isfinite(batch_entropy):
        return state
    target = p.nats
    w, m = state.reweight_w, state.reweight_m
    if p.adaptive:
        direction = _sign(target - batch_entropy)
        w = min(max(w + p.alpha * direction, 1.0), p.w_max)
        m = min(max(m - p.alpha * direction, p.m_min), 1.0)
    return replace(
        state,
        gate_on=batch_entropy < target,
        reweight_w=w,
        reweight_m=m,
        batch_entropy=float(batch_entropy),
        updates=state.updates + 1,
    )


def read(state: StareControllerState, p: StareGateSettings) -> dict[str, float]:
    return {
        "stare/gate_on": float(state.gate_on),
        "stare/reweight_w": state.reweight_w,
        "stare/reweight_m": state.reweight_m,
        "stare/target_entropy": p.nats,
        "stare/batch_entropy": state.batch_entropy if state.batch_entropy is not None else math.nan,
    }


_R = Surface.REPORT
METRICS = (
    metric(
        "stare/gate_on",
        "flag",
        "The target-entropy gate: 1 when H̄ < H_tgt (reweighting on), else 0.",
        prometheus="stare_job_gate_on",
        prometheus_help="STARE target-entropy gate (1 on, 0 off).",
        shown=[_R],
        applies_to="stare",
    ),
    metric(
        "stare/reweight_w",
        "weight",
        "W, the weight of the selected high-surprisal tokens with Â > 0 (L⁺).",
        prometheus="stare_job_reweight_w",
        prometheus_help="STARE weight W on high-surprisal positive tokens.",
        shown=[_R],
        applies_to="stare",
    ),
    metric(
        "stare/reweight_m",
        "weight",
        "M, the weight of the selected high-surprisal tokens with Â < 0 (L⁻, variant C2).",
        prometheus="stare_job_reweight_m",
        prometheus_help="STARE weight M on high-surprisal negative tokens (C2).",
        shown=[_R],
        applies_to="stare",
    ),
    metric(
        "stare/target_entropy",
        "nats",
        "H_tgt, the gate's target entropy (algorithm.control.target_entropy, resolved).",
        prometheus="stare_job_target_entropy_nats",
        prometheus_help="STARE target entropy.",
        shown=[_R],
        applies_to="stare",
    ),
    metric(
        "stare/batch_entropy",
        "nats",
        "H̄ as the gate measured it (equal to entropy/mean).",
        applies_to="stare",
    ),
)

STARE_GATE = Controller(
    NAME,
    StareGateSettings,
    StareControllerState,
    initial=initial_state,
    step=update,
    read=read,
    metrics=METRICS,
    controls=frozenset({"gate_on"}),
)
