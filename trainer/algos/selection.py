"""Token selection rules, each a pure function of detached per-token tensors over one selection scope.

- STARE's surprisal-ranked sets L⁺/L⁻ and the weights ω built from them (STARE, ALGORITHMS.md §5).
- RSI-S keep mask: r_lo ≤ s/H ≤ r_hi (Relative Surprisal Index; a reconstruction, §6).
- Top-entropy ("forking token") mask of "Beyond the 80/20 rule".
- Covariance selections of Clip-Cov and KL-Cov ("The Entropy Mechanism of RL for Reasoning LMs").

Counts that decide how many tokens to pick stay on the device (ranks compared with a tensor k), so none
of these functions forces a host sync. Ties in a ranking are broken by position (stable sort).
"""

from __future__ import annotations

import torch
from torch import Tensor

Metrics = dict[str, Tensor]


def ceil_count(n: Tensor, ratio: float) -> Tensor:
    """min(n, ⌈n·ratio⌉), with the official code's guard against floating error: int(n·ratio + 0.999999)."""
    n64 = n.to(torch.float64)
    return torch.floor(n64 * ratio + 0.999999).clamp(max=n64).to(torch.int64)


def floor_count(n: Tensor, ratio: float) -> Tensor:
    """⌊n·ratio⌋."""
    return torch.floor(n.to(torch.float64) * ratio).to(torch.int64)


def top_k_mask(scores: Tensor, candidates: Tensor, k: Tensor) -> Tensor:
    """Marks the k candidates with the largest scores (all candidates if fewer). Shapes: any, equal."""
    flat_scores = scores.reshape(-1).to(torch.float32)
    flat_cand = candidates.reshape(-1)
    ranked = torch.where(flat_cand, flat_scores, torch.full_like(flat_scores, float("-inf")))
    order = torch.argsort(ranked, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return ((rank < k) & flat_cand).view(candidates.shape)


def broadcast_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """(B,) → (B, T); (B, T) unchanged."""
    if advantages.shape == like.shape:
        return advantages
    if advantages.dim() == 1 and advantages.shape[0] == like.shape[0]:
        return advantages.unsqueeze(-1).expand_as(like)
    raise ValueError(
        f"advantages shape {tuple(advantages.shape)} must be (B,) or (B, T) with (B, T) = {tuple(like.shape)}"
    )


def stare_selection(
    surprisal: Tensor, advantages: Tensor, response_mask: Tensor, *, top_ratio: float, negative: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (L⁺, L⁻, T⁺, T⁻) as boolean masks over the scope. L⁻ is empty unless `negative`.

    T± are the active tokens with Â ≷ 0; L± the max(1, ⌈P·|T±|⌉) of them with the highest surprisal,
    pooled over every row of the scope. An empty T selects nothing; P = 0 selects nothing.
    """
    active = response_mask.bool()
    adv = broadcast_advantages(advantages, surprisal)
    pos = active & (adv > 0)
    neg = active & (adv < 0)
    s = surprisal.detach()

    def pick(cand: Tensor) -> Tensor:
        n = cand.sum()
        k = ceil_count(n, top_ratio)
        if top_ratio > 0:
            k = torch.where(n > 0, k.clamp(min=1), k)
        return top_k_mask(s, cand, k)

    chosen_pos = pick(pos)
    chosen_neg = pick(neg) if negative else torch.zeros_like(neg)
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
    """ω over the scope (B, T) fp32: W on L⁺ (and M on L⁻ for C2) when the gate is on, 1 elsewhere."""
    active = response_mask.bool()
    n_active = active.sum().clamp_min(1).to(torch.float32)
    chosen_pos, chosen_neg, pos, neg = stare_selection(
        surprisal, advantages, response_mask, top_ratio=top_ratio, negative=(variant == "C2")
    )
    weights = torch.ones(surprisal.shape, dtype=torch.float32, device=surprisal.device)
    if gate_on:
        weights = torch.where(chosen_pos, torch.full_like(weights, reweight_w), weights)
        weights = torch.where(chosen_neg, torch.full_like(weights, reweight_m), weights)
    else:
        chosen_pos = torch.zeros_like(chosen_pos)
        chosen_neg = torch.zeros_like(chosen_neg)
    metrics = {
        "stare/positive_candidate_ratio": pos.sum() / n_active,
        "stare/negative_candidate_ratio": neg.sum() / n_active,
        "stare/positive_reweight_ratio": chosen_pos.sum() / n_active,
        "stare/negative_reweight_ratio": chosen_neg.sum() / n_active,
        "stare/mean_weight": torch.where(
            active.any(), (weights * active).sum() / n_active, weights.new_ones(())
        ),
    }
    return weights, metrics


def relative_surprisal_index(surprisal: Tensor, entropy: Tensor, *, eps: float = 1e-6) -> Tensor:
    """RSI = s / max(H, eps)."""
    return surprisal / entropy.clamp_min(eps)


def rsi_keep_mask(
    surprisal: Tensor,
    entropy: Tensor,
    response_mask: Tensor,
    *,
    mode: str,
    low: float,
    high: float,
    eps: float = 1e-6,
) -> tuple[Tensor, Metrics]:
    """Keeps active tokens with low ≤ RSI ≤ high ("fixed") or between the low/high quantiles of the
    scope's RSI values ("quantile", where low/high are quantile levels in [0, 1])."""
    active = response_mask.bool()
    rsi = relative_surprisal_index(surprisal.detach().float(), entropy.detach().float(), eps=eps)
    n_active = active.sum().clamp_min(1).to(torch.float32)
    values = rsi[active]
    if mode == "quantile" and values.numel() > 0:
        q = torch.quantile(values.double(), torch.tensor([low, high], dtype=torch.float64, device=rsi.device))
        lo_bound, hi_bound = q[0].float(), q[1].float()
    else:
        lo_bound = torch.tensor(low, dtype=torch.float32, device=rsi.device)
        hi_bound = torch.tensor(high, dtype=torch.float32, device=rsi.device)
    below = active & (rsi < lo_bound)
    above = active & (rsi > hi_bound)
    keep = active & ~below & ~above
    mean = values.mean() if values.numel() else rsi.new_zeros(())
    std = values.std(unbiased=False) if values.numel() else rsi.new_zeros(())
    return keep, {
        "rsi/kept_ratio": keep.sum() / n_active,
        "rsi/dropped_low_fraction": below.sum() / n_active,
        "rsi/dropped_high_fraction": above.sum() / n_active,
        "rsi/mean": mean,
        "rsi/std": std,
    }


def top_entropy_mask(entropy: Tensor, response_mask: Tensor, *, top_ratio: float) -> Tensor:
    """The ⌈ρ·N⌉ active tokens of highest entropy (the 80/20 rule's forking tokens)."""
    active = response_mask.bool()
    k = ceil_count(active.sum(), top_ratio)
    return top_k_mask(entropy.detach(), active, k)


def token_covariance(advantages: Tensor, logprob: Tensor, response_mask: Tensor) -> Tensor:
    """cov_t = (Â_t − mean Â)(ℓ_t − mean ℓ), means over active tokens; 0 on inactive tokens. (B, T)."""
    active = response_mask.bool()
    adv = broadcast_advantages(advantages, logprob).float()
    lp = logprob.detach().float()
    n = active.sum().clamp_min(1)
    mean_adv = (adv * active).sum() / n
    mean_lp = (lp * active).sum() / n
    return torch.where(active, (adv - mean_adv) * (lp - mean_lp), torch.zeros_like(lp))


def random_subset_mask(candidates: Tensor, k: Tensor, generator: torch.Generator | None) -> Tensor:
    """k candidates drawn uniformly without replacement (all of them if fewer)."""
    noise = torch.rand(candidates.shape, generator=generator, device=candidates.device)
    return top_k_mask(noise, candidates, k)
