"""Token selection rules, each a pure function of detached per-token tensors over one selection scope.

- STARE's surprisal-ranked sets L⁺/L⁻ and the weights ω built from them (STARE, ALGORITHMS.md §5).
- RSI-S keep mask: r_lo ≤ s/H ≤ r_hi (Relative Surprisal Index; a reconstruction, §6).
- Top-entropy ("forking token") mask of "Beyond the 80/20 rule".
- Covariance selections of Clip-Cov and KL-Cov ("The Entropy Mechanism of RL for Reasoning LMs").

Counts that decide how many tokens to pick stay on the device (ranks compared with a tensor k), so none
of these functions forces a host sync. Ties in a ranking are broken by position (stable sort).
"""

from __future__ import annotations

import math

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


def _sort_keys(scores: Tensor, candidates: Tensor) -> Tensor:
    """int32 keys ordered as a descending torch.sort orders the fp32 scores with non-candidates at −inf:
    −0 equals +0, and every NaN ranks above +inf (all NaNs equal). Flipping the low 31 bits of negative
    floats makes the signed integer order the float order."""
    ranked = torch.where(candidates, scores + 0.0, float("-inf"))  # + 0.0 turns −0 into +0
    ranked = torch.where(torch.isnan(ranked), float("nan"), ranked)  # one NaN bit pattern
    bits = ranked.view(torch.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def top_k_mask(scores: Tensor, candidates: Tensor, k: Tensor, *, max_k: int | None = None) -> Tensor:
    """Marks the k candidates with the largest scores (all candidates if fewer). Shapes: any, equal.

    The ranking is that of a stable descending sort of the scores with non-candidates at −inf: ties are
    broken by position, NaN ranks first. `max_k`, when given, must bound k (callers derive it from shapes,
    never by reading k, so there is no host sync). The k-th largest score then comes from a top-max_k
    instead of a full sort, every token above it is chosen, and the tokens tied with it are taken in
    position order until there are k. Both paths choose the same tokens.
    """
    flat_scores = scores.reshape(-1).to(torch.float32)
    flat_cand = candidates.reshape(-1)
    n = flat_scores.numel()
    if max_k is None or n == 0:
        ranked = torch.where(flat_cand, flat_scores, torch.full_like(flat_scores, float("-inf")))
        order = torch.argsort(ranked, descending=True, stable=True)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel(), device=order.device)
        return ((rank < k) & flat_cand).view(candidates.shape)
    bound = min(max(int(max_k), 1), n)
    keys = _sort_keys(flat_scores, flat_cand)  # (n,) int32
    # An unsorted top-bound (a selection, O(n)) and an ascending sort of those `bound` keys are several
    # times faster on CPU than a sorted (descending) topk.
    top = torch.sort(torch.topk(keys, bound, sorted=False).values).values  # (bound,) ascending
    kth = top.gather(0, (bound - k.clamp(1, bound)).view(1).to(torch.int64))  # the k-th largest key, (1,)
    n_above = (top > kth).sum()  # every key above the k-th largest is in `top`
    tied = keys == kth
    # k ≤ 0 chooses nothing: kth is then the largest key and the running tie count starts at 1.
    chosen = (keys > kth) | (tied & (torch.cumsum(tied, 0) <= k - n_above))
    return (chosen & flat_cand).view(candidates.shape)


def ceil_count_bound(n: int, ratio: float) -> int:
    """An upper bound, from a size alone, on `ceil_count(c, ratio)` (clamped to ≥ 1) for any count c ≤ n:
    the same float64 arithmetic, which is monotone in c."""
    return max(1, min(n, math.floor(float(n) * ratio + 0.999999)))


def broadcast_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """(B,) → (B, T); (B, T) unchanged."""
    if advantages.shape == like.shape:
        return advantages
    if advantages.dim() == 1 and advantages.shape[0] == like.shape[0]:
        return advantages.unsqueeze(-1).expand_as(like)
    raise ValueError(
        f"advantages shape {tuple(advantages.shape)} must be (B,) or (B, T) with (B, T) = {tuple(like.shape)}"
    )


def _signed_candidates(
    advantages: Tensor, response_mask: Tensor, like: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(active, T⁺, T⁻) boolean masks: active tokens with Â > 0 and with Â < 0."""
    active = response_mask.bool()
    adv = broadcast_advantages(advantages, like)
    return active, active & (adv > 0), active & (adv < 0)


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
    _, pos, neg = _signed_candidates(advantages, response_mask, surprisal)
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
    """
    active, pos, neg = _signed_candidates(advantages, response_mask, surprisal)
    n_active_raw = torch.count_nonzero(active)
    n_active = n_active_raw.clamp_min(1).to(torch.float32)
    device = surprisal.device
    if gate_on:
        s = surprisal.detach()
        chosen_pos = _pick_top_surprisal(s, pos, top_ratio)
        w = torch.tensor(reweight_w, dtype=torch.float32, device=device)
        weights = torch.where(chosen_pos, w, torch.ones((), dtype=torch.float32, device=device))
        if variant == "C2":
            chosen_neg = _pick_top_surprisal(s, neg, top_ratio)
            m = torch.tensor(reweight_m, dtype=torch.float32, device=device)
            weights = torch.where(chosen_neg, m, weights)
        else:
            chosen_neg = torch.zeros_like(neg)
    else:
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
    return top_k_mask(entropy.detach(), active, k, max_k=ceil_count_bound(active.numel(), top_ratio))


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
