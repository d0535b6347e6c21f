"""The first-generation PI entropy laws' actuators: their losses (docs/ALGORITHMS.md §11).

The laws (tensor-free: settings, state, `pi_step`, the actuator's value from u, metrics) are declared in
contract/control/pi.py; each loss here reads the value the law set (`control.actuator`):

- `entropy_pi`: α = span·u; loss = grpo_ds per-token loss − α·H_t (`entropy_bonus_term`), α of either
  sign (α < 0 sharpens the policy);
- `stare_pi`: STARE's token weights ω with W (on L⁺) and, for C2, M (on L⁻) from u (`stare_pi_weights`),
  always applied (no gate: u = 0 gives W = M = 1, grpo_ds);
- `clip_pi`: the clipped surrogate with ε_high = clip_high + span·u, kept ≥ 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from contract.control.pi import PiState, StarePiParams, clip_high_of, stare_pi_weights
from contract.hyperparams import ClipLossParams
from trainer.algos.control import register_actuator
from trainer.algos.stare import stare_weights
from trainer.algos.surrogate import Metrics, PolicyLossInputs, clipped_surrogate, finish, prepare

__all__ = ["clip_high_of", "entropy_bonus_term", "stare_pi_step_weights", "stare_pi_weights"]


def stare_pi_step_weights(
    state: PiState, p: Any, old_logprob: Tensor | None, advantages: Tensor, mask: Tensor
) -> tuple[Tensor | None, dict[str, float]]:
    """ω over the whole step batch (scope step_batch) from π_old's surprisal; None per micro-batch."""
    if not isinstance(p, StarePiParams) or p.scope != "step_batch" or old_logprob is None:
        return None, {}
    w, m = _stare_wm(state)
    weights, metrics = _weights(old_logprob, advantages, mask, p, w, m)
    return weights, {k: float(v) for k, v in metrics.items()}


# ------------------------------------------------------------------------------------------ losses


def entropy_bonus_term(per_token: Tensor, entropy: Tensor, coef: float) -> Tensor:
    """The per-token loss with the bonus: per_token − α·H_t, α of either sign (α < 0 sharpens)."""
    return per_token - coef * entropy


def _actuator(control: PiState | None, at_zero: float) -> float:
    """The value the controller set, or the actuator's value at u = 0 (no control, or none set)."""
    return at_zero if control is None or control.actuator is None else control.actuator


def _stare_wm(control: PiState | None) -> tuple[float, float]:
    w = _actuator(control, 1.0)
    m = 1.0 if control is None or control.actuator_m is None else control.actuator_m
    return w, m


@register_actuator("entropy_pi")
def entropy_pi_loss(
    inputs: PolicyLossInputs, p: ClipLossParams, control: PiState | None = None
) -> tuple[Tensor, Metrics]:
    """grpo_ds per-token loss − α·H_t, α = `control.actuator` (span·u; None: α = 0, grpo_ds)."""
    if inputs.entropy is None:
        raise ValueError("entropy_pi needs inputs.entropy (per-token entropy of the current pass)")
    coef = _actuator(control, 0.0)
    logprob, old, adv, mask = prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    if coef != 0:
        if not inputs.entropy.requires_grad and torch.is_grad_enabled() and logprob.requires_grad:
            raise ValueError("entropy_pi with a non-zero coefficient needs a differentiable entropy")
        per_token = entropy_bonus_term(per_token, inputs.entropy, coef)
    metrics["entropy_bonus/coef"] = torch.tensor(float(coef))
    return finish(per_token, inputs, p, metrics)


def _weights(
    logprob: Tensor, advantages: Tensor, mask: Tensor, p: StarePiParams, w: float, m: float
) -> tuple[Tensor, Metrics]:
    return stare_weights(
        -logprob.detach(),
        advantages,
        mask,
        top_ratio=p.top_ratio,
        reweight_w=w,
        reweight_m=m,
        variant=p.variant,
        gate_on=True,
    )


@register_actuator("stare_pi", token_weights=stare_pi_step_weights)
def stare_pi_loss(
    inputs: PolicyLossInputs, p: StarePiParams, control: PiState | None = None
) -> tuple[Tensor, Metrics]:
    """ω · (grpo_ds per-token loss), ω from STARE's selection with W (L⁺) and M (L⁻, C2) as the controller
    set them (`control.actuator`, `actuator_m`; None: W = M = 1, grpo_ds), or precomputed over the step
    batch in `inputs.token_weights` (scope step_batch)."""
    w, m = _stare_wm(control)
    logprob, old, adv, mask = prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    if inputs.token_weights is not None:
        weights = inputs.token_weights.float().detach()
    else:
        weights, stare_metrics = _weights(logprob, adv, mask, p, w, m)
        metrics.update(stare_metrics)
    metrics["stare/reweight_w"] = torch.tensor(w)
    metrics["stare/reweight_m"] = torch.tensor(m)
    return finish(per_token * weights, inputs, p, metrics)


@register_actuator("clip_pi")
def clip_pi_loss(
    inputs: PolicyLossInputs, p: ClipLossParams, control: PiState | None = None
) -> tuple[Tensor, Metrics]:
    """The clipped surrogate with ε_high = `control.actuator` (clip_high + span·u; None: clip_high)."""
    eps = _actuator(control, p.clip_high)
    logprob, old, adv, mask = prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, dataclasses.replace(p, clip_high=eps))
    return finish(per_token, inputs, p, metrics)
