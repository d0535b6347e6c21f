"""Reward shaping and batch filtering around the loss.

- DAPO's soft overlong penalty (DAPO, Eq. 13): with budget L_max and buffer L_cache,
  0 if |y| ≤ L_max − L_cache; ((L_max − L_cache) − |y|) / L_cache if L_max − L_cache < |y| ≤ L_max; −1 beyond.
- DAPO dynamic sampling: keep only groups whose rewards are not all equal. With a declared binary reward
  equality is exact; otherwise a group counts as constant when its std is below a tolerance.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer.algos.advantages import group_mean_std


def overlong_penalty(lengths: Tensor, *, max_length: int, cache_length: int) -> Tensor:
    if max_length < 1:
        raise ValueError(f"max_length must be ≥ 1, got {max_length}")
    if not 0 < cache_length <= max_length:
        raise ValueError(f"cache_length must be in (0, max_length], got {cache_length}")
    length = lengths.to(torch.float32)
    start = float(max_length - cache_length)
    ramp = (start - length) / float(cache_length)
    penalty = torch.where(length <= start, torch.zeros_like(length), ramp)
    return torch.where(length > max_length, torch.full_like(length, -1.0), penalty)


def informative_groups(
    rewards: Tensor, group_ids: Tensor, *, binary: bool = True, std_tol: float = 1e-6
) -> Tensor:
    """Per-response bool: its group's rewards are not all equal (groups of one are never informative)."""
    _, stds, sizes = group_mean_std(rewards, group_ids)
    if binary:
        _, inverse = torch.unique(group_ids, return_inverse=True)
        n = int(inverse.max().item()) + 1 if inverse.numel() else 0
        lo = torch.full((n,), float("inf"), dtype=torch.float64).scatter_reduce(
            0, inverse, rewards.double(), "amin"
        )
        hi = torch.full((n,), float("-inf"), dtype=torch.float64).scatter_reduce(
            0, inverse, rewards.double(), "amax"
        )
        varied = (hi > lo)[inverse]
    else:
        varied = stds > std_tol
    return varied & (sizes >= 2)
