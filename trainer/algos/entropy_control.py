"""The adaptive entropy-bonus coefficient (Skywork-OR1's adaptive entropy control, arXiv 2505.22312).

The nearest rival to STARE's gate: both react to the measured entropy H̄ of π_old on the training batch
against one target H_tgt. STARE reweights a few high-surprisal tokens' advantages; this adds −α·H to the
loss. Once per optimiser step, before the update:

    α_k     = c_k · 1[H̄_k < H_tgt]                     (the bonus acts only below the target)
    c_{k+1} = clip(c_k + Δ·sgn(H_tgt − H̄_k), 0, c_max)

A non-finite H̄ leaves the state unchanged. The state is a frozen dataclass, saved in checkpoints; its
target is the controller's own setting (algorithm.entropy_control, `EntropyControlParams`).
`EntropyCoefController` is the engine's controller (trainer.algos.control's protocol).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from contract.hyperparams import AdaptiveEntropyParams, EntropyControlParams
from trainer.algos.control import StepStatistics, register_controller


@dataclass(frozen=True)
class EntropyCoefState:
    coef: float  # c_k: the coefficient the next measurement starts from
    applied: float = 0.0  # α of the last step
    batch_entropy: float | None = None
    updates: int = 0

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """The bounds every state keeps: c and α finite and ≥ 0, a finite H̄, updates ≥ 0."""
        for name in ("coef", "applied"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name} must be a finite number ≥ 0, got {value!r}")
        if self.batch_entropy is not None and not math.isfinite(self.batch_entropy):
            raise ValueError(f"batch_entropy must be finite or None, got {self.batch_entropy!r}")
        if self.updates < 0:
            raise ValueError(f"updates must be ≥ 0, got {self.updates!r}")

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


COEF_METRICS = frozenset({"entropy_bonus/coef", "entropy_bonus/active", "entropy_bonus/target_entropy"})


@register_controller("entropy_coef", EntropyCoefState)
@dataclass(frozen=True)
class EntropyCoefController:
    """The adaptive entropy coefficient as the engine's controller; owns the entropy_bonus/ metrics."""

    settings: EntropyControlParams
    loss_params: AdaptiveEntropyParams
    name = "entropy_coef"
    state_cls = EntropyCoefState

    def __post_init__(self) -> None:
        if not isinstance(self.loss_params, AdaptiveEntropyParams):
            raise ValueError(
                f"the entropy coefficient needs AdaptiveEntropyParams, got {type(self.loss_params).__name__}"
            )

    @property
    def target_entropy(self) -> float:
        return self.settings.target_entropy

    def initial_state(self) -> EntropyCoefState:
        return initial_coef_state(self.loss_params)

    def update(self, state: EntropyCoefState, stats: StepStatistics) -> EntropyCoefState:
        return update_coef(state, stats.batch_entropy, self.settings.target_entropy, self.loss_params)

    def metrics(self, state: EntropyCoefState, stats: StepStatistics) -> dict[str, float]:
        return {
            "entropy_bonus/coef": state.applied,
            "entropy_bonus/active": float(state.applied > 0),
            "entropy_bonus/target_entropy": self.settings.target_entropy,
        }

    def metric_names(self) -> frozenset[str]:
        return COEF_METRICS

    def token_weights(
        self, state: EntropyCoefState, old_logprob: Any, advantages: Any, mask: Any
    ) -> tuple[None, dict[str, float]]:
        return None, {}
