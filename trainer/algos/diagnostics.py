"""Entropy-dynamics diagnostics (STARE's first-order analysis, ALGORITHMS.md §1; [derived] facts).

For logits z with p = softmax(z), entropy H and surprisal s_k = −log p_k:
- dH/dz_k = p_k (s_k − H), summing to 0 over k.
- A policy-gradient step Δz = η Â (e_a − p) changes H, to first order, by η Â Φ with
  Φ = p_a (s_a − H) − C(p),  C(p) = Σ_k p_k² (s_k − H) ≤ 0,  E_{a∼p}[Φ] = 0.
- Quadrants: Â ≷ 0 × (s ≷ H). Â > 0 with s < H lowers entropy; Â > 0 with s > H raises it; mirrored for Â < 0.

`quadrant_analysis` reports, per quadrant, the token fraction and the predicted entropy drift Σ Â·Φ,
normalised like the token-mean loss (by the step's active-token count). A token with s = H counts as
low-surprisal; a token with Â = 0 belongs to no quadrant.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer.algos.selection import broadcast_advantages

Metrics = dict[str, Tensor]

QUADRANTS = ("pos_low", "pos_high", "neg_low", "neg_high")


def entropy_sensitivity(logprob: Tensor, entropy: Tensor, correction: Tensor) -> Tensor:
    """Φ = p_a (s_a − H) − C(p) per token, from quantities the chunked kernel already returns."""
    lp = logprob.detach().float()
    return lp.exp() * (-lp - entropy.float()) - correction.float()


def quadrant_masks(
    advantages: Tensor, surprisal: Tensor, entropy: Tensor, response_mask: Tensor
) -> dict[str, Tensor]:
    active = response_mask.bool()
    adv = broadcast_advantages(advantages, surprisal)
    high = surprisal > entropy
    pos, neg = active & (adv > 0), active & (adv < 0)
    return {"pos_low": pos & ~high, "pos_high": pos & high, "neg_low": neg & ~high, "neg_high": neg & high}


def quadrant_analysis(
    advantages: Tensor,
    logprob: Tensor,
    entropy: Tensor,
    correction: Tensor,
    response_mask: Tensor,
    *,
    global_token_count: float | None = None,
) -> Metrics:
    """Token fractions and predicted first-order entropy drift per quadrant (all tensors (B, T))."""
    mask = response_mask.float()
    n_local = mask.sum()
    denom = (
        torch.tensor(float(global_token_count)) if global_token_count is not None else n_local
    ).clamp_min(1.0)
    adv = broadcast_advantages(advantages, logprob).float()
    phi = entropy_sensitivity(logprob, entropy, correction)
    contribution = adv * phi  # (B, T)
    metrics: Metrics = {}
    total = torch.zeros(())
    for name, q in quadrant_masks(adv, -logprob.detach().float(), entropy.float(), mask).items():
        metrics[f"quadrant/{name}_fraction"] = q.sum() / n_local.clamp_min(1.0)
        drift = (contribution * q).sum() / denom
        metrics[f"quadrant/{name}_drift"] = drift
        total = total + drift
    metrics["quadrant/predicted_drift"] = total
    return metrics
