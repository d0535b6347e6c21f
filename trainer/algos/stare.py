"""STARE in one place: its parameters, its target-entropy gate, its token weights ω and its loss.

ALGORITHMS.md §5 has the formulas and the defaults; this module follows the official code's semantics.

- Parameters: `StareParams` (the loss: P, W, M, variant, scope) and `StareGateParams` (the gate: H_tgt
  and the adaptive W/M schedule), defined with the other algorithms' parameters in contract.hyperparams.
- Controller, once per optimiser step before the update, from H̄ (token-mean entropy of π_old over the
  filtered training batch), `update`:
  - gate_on = H̄ < H_tgt (strict; off at equality). No band, no gain, no hysteresis.
  - adaptive (off by default): W ← clip(W + α·sgn(H_tgt − H̄), 1, w_max),
    M ← clip(M − α·sgn(H_tgt − H̄), m_min, 1).
  - a non-finite H̄ leaves the state unchanged; before any measurement the gate is on.
  The state is a frozen dataclass so the loop can save and restore it exactly (checkpoints).
- Token weights over one selection scope (a micro-batch, or the whole step batch), `stare_weights`:
  T± are the active tokens with Â ≷ 0; L± the max(1, ⌈P·|T±|⌉) of them with the highest surprisal
  s = −log π_old; ω = W on L⁺ (and M on L⁻ for C2) while the gate is on, 1 elsewhere.
- Loss, `stare_loss`: ω · (grpo_ds per-token loss), token-mean. The controller's state is the loss's
  `control` argument (checked where it enters the loss, trainer.algos.control.check_control). W and M are
  the state's: the params' reweight_w and reweight_m are the gate's starting values, which is what a
  control of None stands for (`initial_state(params)`, gate on).
- Controller for the engine: `StareGate` (trainer.algos.control's protocol), which owns the stare/ gate
  metrics of the step.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import Tensor

from contract.hyperparams import StareGateParams, StareParams
from trainer.algos.control import StepStatistics, register_controller
from trainer.algos.selection import ceil_count, ceil_count_bound, signed_candidates, top_k_mask
from trainer.algos.surrogate import (
    Metrics,
    PolicyLossInputs,
    clipped_surrogate,
    finish,
    prepare,
    register_loss,
)

__all__ = [
    "VARIANTS",
    "StareControllerState",
    "StareGate",
    "StareGateParams",
    "StareParams",
    "initial_state",
    "scope_weights",
    "stare_loss",
    "stare_selection",
    "stare_weights",
    "update",
]

VARIANTS = ("O1", "C2")  # O1: W on L⁺ only; C2: W on L⁺ and M on L⁻

# ------------------------------------------------------------------------------------------ controller


@dataclass(frozen=True)
class StareControllerState:
    gate_on: bool
    reweight_w: float
    reweight_m: float
    batch_entropy: float | None = None  # last finite H̄ measured
    updates: int = 0  # finite measurements applied

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """The bounds every state of the gate keeps: W ≥ 1, M in (0, 1], a finite H̄, updates ≥ 0."""
        if not isinstance(self.gate_on, bool):
            raise ValueError(f"gate_on must be a bool, got {self.gate_on!r}")
        if not (math.isfinite(self.reweight_w) and self.reweight_w >= 1.0):
            raise ValueError(f"reweight_w (W) must be ≥ 1, got {self.reweight_w!r}")
        if not 0.0 < self.reweight_m <= 1.0:
            raise ValueError(f"reweight_m (M) must be in (0, 1], got {self.reweight_m!r}")
        if self.batch_entropy is not None and not math.isfinite(self.batch_entropy):
            raise ValueError(f"batch_entropy must be finite or None, got {self.batch_entropy!r}")
        if self.updates < 0:
            raise ValueError(f"updates must be ≥ 0, got {self.updates!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StareControllerState:
        return cls(**data)


def initial_state(params: StareGateParams | StareParams) -> StareControllerState:
    """Before any measurement: the gate on, W and M at their configured values."""
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


@register_controller("stare_gate", StareControllerState)
@dataclass(frozen=True)
class StareGate:
    """STARE's gate as the engine's controller (trainer.algos.control): `update` once per step; it owns
    the stare/ gate metrics of the step's event."""

    settings: StareGateParams
    loss_params: Any = None
    name = "stare_gate"
    state_cls = StareControllerState

    @property
    def target_entropy(self) -> float:
        return self.settings.target_entropy

    def initial_state(self) -> StareControllerState:
        return initial_state(self.settings)

    def update(self, state: StareControllerState, stats: StepStatistics) -> StareControllerState:
        return update(state, stats.batch_entropy, self.settings)

    def metrics(self, state: StareControllerState, stats: StepStatistics) -> dict[str, float]:
        return {
            "stare/gate_on": float(state.gate_on),
            "stare/reweight_w": state.reweight_w,
            "stare/reweight_m": state.reweight_m,
            "stare/target_entropy": self.settings.target_entropy,
            "stare/batch_entropy": stats.batch_entropy,
        }

    def metric_names(self) -> frozenset[str]:
        return GATE_METRICS

    def token_weights(
        self, state: StareControllerState, old_logprob: Tensor | None, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor | None, dict[str, float]]:
        """ω over the whole step batch (scope step_batch), ranked by π_old's surprisal; None where ω is
        chosen per micro-batch in the loss."""
        p = self.loss_params
        if not isinstance(p, StareParams) or p.scope != "step_batch" or old_logprob is None:
            return None, {}
        weights, metrics = scope_weights(old_logprob, advantages, mask, p, state)
        return weights, {k: float(v) for k, v in metrics.items()}


GATE_METRICS = frozenset(
    {"stare/gate_on", "stare/reweight_w", "stare/reweight_m", "stare/target_entropy", "stare/batch_entropy"}
)

# ------------------------------------------------------------------------------------------ token weights


def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")


def _pick_top_surprisal(surprisal: Tensor, candidates: Tensor, top_ratio: float) -> Tensor:
    """The max(1, ⌈P·|T|⌉) candidates with the highest surprisal; nothing if T is empty or P = 0."""
    n = torch.count_nonzero(candidates)
    k = ceil_count(n, top_ratio)
    if top_ratio > 0:
        k = torch.where(n > 0, k.clamp(min=1), k)
    return top_k_mask(surprisal, candidates, k, max_k=ceil_count_bound(candidates.numel(), top_ratio))


def stare_selection(
    surprisal: Tensor, advantages: Tensor, response_mask: Tensor, *, top_ratio: float, negative: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (L⁺, L⁻, T⁺, T⁻) as boolean masks over the scope. L⁻ is empty unless `negative`.

    T± are the active tokens with Â ≷ 0; L± the max(1, ⌈P·|T±|⌉) of them with the highest surprisal,
    pooled over every row of the scope. An empty T selects nothing; P = 0 selects nothing.
    """
    _, pos, neg = signed_candidates(advantages, response_mask, surprisal)
    s = surprisal.detach()
    chosen_pos = _pick_top_surprisal(s, pos, top_ratio)
    chosen_neg = _pick_top_surprisal(s, neg, top_ratio) if negative else torch.zeros_like(neg)
    return chosen_pos, chosen_neg, pos, neg


def stare_weights(
    surprisal: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    top_ratio: float,
    reweight_w: float,
    reweight_m: float,
    variant: str,
    gate_on: bool,
) -> tuple[Tensor, Metrics]:
    """ω over the scope (B, T) fp32: W on L⁺ (and M on L⁻ for C2) when the gate is on, 1 elsewhere.

    With the gate off nothing is selected (the candidate ratios are still reported) and no ranking runs.
    `variant` is "O1" or "C2"; any other value is a ValueError.
    """
    _check_variant(variant)
    active = response_mask.bool()
    n_active_raw = torch.count_nonzero(active)
    n_active = n_active_raw.clamp_min(1).to(torch.float32)
    device = surprisal.device
    if gate_on:
        c2 = variant == "C2"
        chosen_pos, chosen_neg, pos, neg = stare_selection(
            surprisal, advantages, response_mask, top_ratio=top_ratio, negative=c2
        )
        w = torch.tensor(reweight_w, dtype=torch.float32, device=device)
        weights = torch.where(chosen_pos, w, torch.ones((), dtype=torch.float32, device=device))
        if c2:
            m = torch.tensor(reweight_m, dtype=torch.float32, device=device)
            weights = torch.where(chosen_neg, m, weights)
    else:
        _, pos, neg = signed_candidates(advantages, response_mask, surprisal)
        weights = torch.ones(surprisal.shape, dtype=torch.float32, device=device)
        chosen_pos = torch.zeros_like(pos)
        chosen_neg = torch.zeros_like(neg)
    metrics = {
        "stare/positive_candidate_ratio": torch.count_nonzero(pos) / n_active,
        "stare/negative_candidate_ratio": torch.count_nonzero(neg) / n_active,
        "stare/positive_reweight_ratio": torch.count_nonzero(chosen_pos) / n_active,
        "stare/negative_reweight_ratio": torch.count_nonzero(chosen_neg) / n_active,
        "stare/mean_weight": torch.where(
            n_active_raw > 0, torch.where(active, weights, 0.0).sum() / n_active, weights.new_ones(())
        ),
    }
    return weights, metrics


def scope_weights(
    logprob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    p: StareParams,
    state: StareControllerState,
) -> tuple[Tensor, Metrics]:
    """ω over one scope with the loss's parameters and the gate's state, ranked by the surprisal −logprob:
    of the training pass over a micro-batch (`scope: micro_batch`), or of π_old over the whole step batch
    (`scope: step_batch`, computed once by the engine and passed in `inputs.token_weights`)."""
    return stare_weights(
        -logprob.detach(),
        advantages,
        response_mask,
        top_ratio=p.top_ratio,
        reweight_w=state.reweight_w,
        reweight_m=state.reweight_m,
        variant=p.variant,
        gate_on=state.gate_on,
    )


# ------------------------------------------------------------------------------------------ loss


@register_loss("stare")
def stare_loss(
    inputs: PolicyLossInputs, p: StareParams, control: StareControllerState | None = None
) -> tuple[Tensor, Metrics]:
    """ω · (grpo_ds per-token loss). ω from `stare_weights` over this micro-batch, or precomputed over the
    step batch (`scope_weights`) and passed in `inputs.token_weights`. `control`: the gate's state."""
    state = control if control is not None else initial_state(p)
    logprob, old, adv, mask = prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    if inputs.token_weights is not None:
        weights = inputs.token_weights.float().detach()
    else:
        weights, stare_metrics = scope_weights(logprob, adv, mask, p, state)
        metrics.update(stare_metrics)
    if state.gate_on:
        per_token = per_token * weights
    metrics["stare/gate_on"] = torch.tensor(float(state.gate_on))
    metrics["stare/reweight_w"] = torch.tensor(state.reweight_w)
    metrics["stare/reweight_m"] = torch.tensor(state.reweight_m)
    return finish(per_token, inputs, p, metrics)
