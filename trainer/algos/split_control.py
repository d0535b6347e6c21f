"""entropy_split's actuators: what the law's output does to the loss (docs/ALGORITHMS.md §12; the law itself,
torch-free, is declared in contract/control/split.py).

Per token t of the micro-batch, on the grpo_ds clipped surrogate ℓ_t (token-mean, as grpo_ds):

    loss_t = ω_t·ℓ_t − α·H_t·1[Â_t ≠ 0]
    ω_t    = 1 + κ·sign(Â_t)   where π_old(a_t) ≥ p_conf (a confident token), 1 elsewhere

- raising (u > 0): α = span_up·u, the entropy bonus. It acts on the rows that carry a policy gradient
  (Â ≠ 0), where the drift it answers comes from; so rows with Â = 0 stay inert and the engine keeps
  skipping them (no extra backward, docs/BENCHMARKS.md);
- lowering (u < 0): κ = span_down·(−u) ∈ [0, 1] on the confident tokens only: a confident token with
  Â > 0 is pushed up harder, one with Â < 0 pushed down less, which sharpens what the policy already
  gives p ≥ p_conf and leaves the forking tokens (p < p_conf) as grpo_ds treats them. At ratio 1 (one
  update per batch) the weight still moves the gradient: ∂(ω·ℓ)/∂ℓ_θ = −ω·Â.
At u = 0, α = κ = 0 and the loss is grpo_ds's bit for bit.

Departure from EntroPIC's term (which it resembles): EntroPIC averages its term over the confident tokens;
here the weight is per token inside grpo_ds's token mean, so the loss is independent of how the step batch
is split into micro-batches and processes (the actuator's strength then scales with the confident share,
which the law's integral absorbs), and the bonus reaches only Â ≠ 0 rows.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from contract.control.split import SplitLossParams, SplitState
from trainer.algos.control import register_actuator
from trainer.algos.surrogate import (
    Metrics,
    PolicyLossInputs,
    active_mean,
    clipped_surrogate,
    finish,
    prepare,
)


def confident_weights(old_logprob: Tensor, adv: Tensor, mask: Tensor, kappa: float, p_conf: float) -> Tensor:
    """ω (B, T): 1 + κ·sign(Â) on the active tokens π_old gives p ≥ p_conf, 1 elsewhere."""
    confident = (old_logprob.detach() >= math.log(p_conf)) & mask.bool()
    return torch.where(confident, 1.0 + kappa * torch.sign(adv), torch.ones_like(adv))


@register_actuator("entropy_split")
def entropy_split_loss(
    inputs: PolicyLossInputs, p: SplitLossParams, control: SplitState | None = None
) -> tuple[Tensor, Metrics]:
    """ω·(grpo_ds per-token loss) − α·H_t·1[Â ≠ 0] with α = `control.bonus`, κ = `control.sharpen` (None:
    both 0, grpo_ds); confident: π_old ≥ p.p_conf."""
    alpha = 0.0 if control is None else control.bonus
    kappa = 0.0 if control is None else control.sharpen
    logprob, old, adv, mask = prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    confident = (old.detach() >= math.log(p.p_conf)) & mask.bool()
    metrics["control/confident_fraction"] = active_mean(confident, mask)
    if kappa > 0:
        per_token = per_token * confident_weights(old, adv, mask, kappa, p.p_conf)
    if alpha > 0:
        if inputs.entropy is None:
            raise ValueError("entropy_split with a bonus needs inputs.entropy (per-token, differentiable)")
        if not inputs.entropy.requires_grad and torch.is_grad_enabled() and logprob.requires_grad:
            raise ValueError("entropy_split with a bonus needs a differentiable entropy")
        per_token = per_token - alpha * inputs.entropy * (adv != 0)
    return finish(per_token, inputs, p, metrics)
