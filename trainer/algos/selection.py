"""Token selection rules, each a pure function of detached per-token tensors over one selection scope.

- The ranking every selection shares (`top_k_mask`, the counts, the signed candidate sets T⁺/T⁻); STARE's
  L⁺/L⁻ and ω built on it are in stare.py, RSI-S's keep mask in rsi.py.
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
    # An unsorted top-bound (a selection, O(n)) and an ascending sort of those `bound` keys instead of a
    # sorted (descending) topk: faster on CPU (docs/BENCHMARKS.md, algorithm kernels).
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


def signed_candidates(
    advantages: Tensor, response_mask: Tensor, like: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(active, T⁺, T⁻) boolean masks: active tokens with Â > 0 and with Â < 0."""
    active = response_mask.bool()
    adv = broadcast_advantages(advantages, like)
    return active, active & (adv > 0), active & (adv < 0)


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
