"""STARE in one place: its parameters, its target-entropy gate, its token weights ω and its loss.

ALGORITHMS.md §5 has the formulas and the defaults; this module follows the official code's semantics.

- Parameters: `StareParams` (the loss: P, W, M, variant, scope), with the other algorithms' parameters in
  contract.hyperparams.
- The gate (declared in contract/control/stare_gate.py: its settings `StareGateSettings`, state, update and
  metrics), once per optimiser step before the update, from H̄ (token-mean entropy of π_old over the
  filtered training batch):
  - gate_on = H̄ < H_tgt (strict; off at equality). No band, no gain, no hysteresis.
  - adaptive (off by default): W ← clip(W + α·sgn(H_tgt − H̄), 1, w_max),
    M ← clip(M − α·sgn(H_tgt − H̄), m_min, 1).
  - a non-finite H̄ leaves the state unchanged; before any measurement the gate is on.
- Token weights over one selection scope (a micro-batch, or the whole step batch), `stare_weights`:
  T± are the active tokens with Â ≷ 0; L± the max(1, ⌈P·|T±|⌉) of them with the highest surprisal
  s = −log π_old; ω = W on L⁺ (and M on L⁻ for C2) while the gate is on, 1 elsewhere.
- Loss, `stare_loss`: ω · (grpo_ds per-token loss), token-mean. The controller's state is the loss's
  `control` argument (checked where it enters the loss, trainer.algos.control.check_control). W and M are
  the state's: the params' reweight_w and reweight_m are the gate's starting values, which is what a
  control of None stands for (`initial_state(None, params)`, gate on).
- This module is the gate's actuator (`register_actuator("stare_gate")`): the loss and, for the step scope,
  `step_scope_weights`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from contract.control.stare_gate import StareControllerState, StareGateSettings, initial_state, update
from contract.hyperparams import StareParams
from trainer.algos.control import register_actuator
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
    "StareGateSettings",
    "StareParams",
    "initial_state",
    "scope_weights",
    "stare_loss",
    "stare_selection",
    "stare_weights",
    "update",
]

VARIANTS = ("O1", "C2")  # O1: W on L⁺ only; C2: W on L⁺ and M on L⁻

# The gate itself (settings, state, update, metrics) is declared in contract/control/stare_gate.py; this
# module is its actuator: the token weights and the loss.


def step_scope_weights(
    state: StareControllerState, p: Any, old_logprob: Tensor | None, advantages: Tensor, mask: Tensor
) -> tuple[Tensor | None, dict[str, float]]:
    """ω over the whole step batch (scope step_batch), ranked by π_old's surprisal; None where ω is chosen per
    micro-batch in the loss."""
    if not isinstance(p, StareParams) or p.scope != "step_batch" or old_logprob is None:
        return None, {}
    weights, metrics = scope_weights(old_logprob, advantages, mask, p, state)
    return weights, {k: float(v) for k, v in metrics.items()}


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


@register_actuator("stare_gate", token_weights=step_scope_weights)
@register_loss("stare")
def stare_loss(
    inputs: PolicyLossInputs, p: StareParams, control: StareControllerState | None = None
) -> tuple[Tensor, Metrics]:
    """ω · (grpo_ds per-token loss). ω from `stare_weights` over this micro-batch, or precomputed over the
    step batch (`scope_weights`) and passed in `inputs.token_weights`. `control`: the gate's state."""
    state = control if control is not None else initial_state(None, p)
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
