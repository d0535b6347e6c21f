"""The adaptive entropy-bonus coefficient (Skywork-OR1's adaptive entropy control, arXiv 2505.22312 §3.2),
declared: the controller of `adaptive_entropy` (docs/ALGORITHMS.md §4.11).

The nearest rival to STARE's gate: both react to H̄ of π_old on the training batch against one target.
Once per optimiser step, before the update:

    α_k     = c_k · 1[H̄_k < H_tgt]                     (the bonus acts only below the target)
    c_{k+1} = clip(c_k + Δ·sgn(H_tgt − H̄_k), 0, c_max)

Δ, c_max and c_0 are the loss's parameters (AdaptiveEntropyParams); the loss subtracts α·H_t
(trainer/algos/losses.py, the actuator). A non-finite H̄ leaves the state unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from contract.control.base import Controller, ControlSettings, ControlState
from contract.hyperparams import AdaptiveEntropyParams, ClipLossParams
from contract.metrics_types import metric

NAME = "entropy_coef"


class EntropyCoefSettings(ControlSettings):
    """algorithm.control for adaptive_entropy (formerly algorithm.entropy_control): the target only."""

    controller: Literal["entropy_coef"] = "entropy_coef"


@dataclass(frozen=True)
class EntropyCoefState(ControlState):
    coef: float  # c_k: the coefficient the next measurement starts from
    applied: float = 0.0  # α of the last step
    batch_entropy: float | None = None
    updates: int = 0

    def bounds(self) -> None:
        for name in ("coef", "applied"):
            if getattr(self, name) < 0.0:
                raise ValueError(f"{name} must be a finite number ≥ 0, got {getattr(self, name)!r}")


def _schedule(loss_params: ClipLossParams) -> AdaptiveEntropyParams:
    if not isinstance(loss_params, AdaptiveEntropyParams):
        raise ValueError(
            f"the entropy coefficient needs AdaptiveEntropyParams, got {type(loss_params).__name__}"
        )
    return loss_params


def initial_state(settings: EntropyCoefSettings | None, loss_params: ClipLossParams) -> EntropyCoefState:
    return EntropyCoefState(coef=_schedule(loss_params).coef_init)


def update_coef(
    state: EntropyCoefState, batch_entropy: float, target_entropy: float, params: AdaptiveEntropyParams
) -> EntropyCoefState:
    """One step: α from the current c and the measurement, then c moves by Δ toward the target."""
    if not math.isfinite(batch_entropy):
        return state
    applied = state.coef if batch_entropy < target_entropy else 0.0
    direction = float((target_entropy > batch_entropy) - (target_entropy < batch_entropy))
    coef = min(max(state.coef + params.coef_step * direction, 0.0), params.coef_max)
    return replace(
        state, coef=coef, applied=applied, batch_entropy=float(batch_entropy), updates=state.updates + 1
    )


def read(state: EntropyCoefState, p: EntropyCoefSettings) -> dict[str, float]:
    return {
        "entropy_bonus/coef": state.applied,
        "entropy_bonus/active": float(state.applied > 0),
        "entropy_bonus/target_entropy": p.nats,
    }


METRICS = (
    metric(
        "entropy_bonus/coef",
        "coefficient",
        "α, the entropy bonus's coefficient applied at this step (0 when H̄ ≥ H_tgt).",
        applies_to="adaptive_entropy",
    ),
    metric(
        "entropy_bonus/active",
        "flag",
        "1 when the entropy bonus acted at this step (α > 0), else 0.",
        applies_to="adaptive_entropy",
    ),
    metric(
        "entropy_bonus/target_entropy",
        "nats",
        "H_tgt the coefficient adapts toward (algorithm.control.target_entropy, resolved).",
        applies_to="adaptive_entropy",
    ),
)


def step(
    state: EntropyCoefState, batch_entropy: float, p: EntropyCoefSettings, loss_params: ClipLossParams
) -> EntropyCoefState:
    return update_coef(state, batch_entropy, p.nats, _schedule(loss_params))


ENTROPY_COEF = Controller(
    NAME,
    EntropyCoefSettings,
    EntropyCoefState,
    initial=initial_state,
    step=step,
    read=read,
    metrics=METRICS,
    controls=frozenset({"coef"}),
)
