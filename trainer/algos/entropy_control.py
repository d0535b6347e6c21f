"""The adaptive entropy-bonus coefficient (Skywork-OR1's adaptive entropy control, arXiv 2505.22312).

The nearest rival to STARE's gate: both react to the measured entropy H̄ of π_old on the training batch
against one target H_tgt. STARE reweights a few high-surprisal tokens' advantages; this adds −α·H to the
loss. Once per optimiser step, before the update:

    α_k     = c_k · 1[H̄_k < H_tgt]                     (the bonus acts only below the target)
    c_{k+1} = clip(c_k + Δ·sgn(H_tgt − H̄_k), 0, c_max)

A non-finite H̄ leaves the state unchanged. The state is a frozen dataclass, saved in checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from contract.hyperparams import AdaptiveEntropyParams


@dataclass(frozen=True)
class EntropyCoefState:
    coef: float  # c_k: the coefficient the next measurement starts from
    applied: float = 0.0  # α of the last step
    batch_entropy: float | None = None
    updates: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EntropyCoefState:
        return cls(**data)


def initial_coef_state(params: AdaptiveEntropyParams) -> EntropyCoefState:
    return EntropyCoefState(coef=params.coef_init)


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
