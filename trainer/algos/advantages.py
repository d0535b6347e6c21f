"""Outcome advantages for group-sampled responses (one scalar per response, broadcast over its tokens).

- grpo (DeepSeekMath GRPO): Â_i = (r_i − mean_g r) / (std_g r + eps), unbiased std, eps = 1e-6.
- dr_grpo (Dr.GRPO, "Understanding R1-Zero-Like Training"): Â_i = r_i − mean_g r.

Groups are given by an integer id per response, so a batch need not be laid out group by group.
A group of one follows the official STARE/verl convention (ALGORITHMS.md §3): mean 0 and std 1, so its
GRPO advantage is r/(1 + eps) and its Dr.GRPO advantage is r; it is not zero.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from trainer.algos.registry import Registry

Metrics = dict[str, Tensor]


ADVANTAGE_ESTIMATORS: Registry[Callable[..., tuple[Tensor, Metrics]]] = Registry("advantage estimator")


def _check(rewards: Tensor, group_ids: Tensor) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (one per response), got shape {tuple(rewards.shape)}")
    if group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_ids shape {tuple(group_ids.shape)} must equal rewards shape {tuple(rewards.shape)}"
        )
    if group_ids.is_floating_point():
        raise ValueError("group_ids must be an integer tensor")


def group_mean_std(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-response (mean, unbiased std, group size) of its group; size-1 groups get mean 0, std 1."""
    _check(rewards, group_ids)
    r = rewards.to(torch.float64)  # exact sums for the usual small groups
    _, inverse = torch.unique(group_ids, return_inverse=True)  # (B,) dense group index
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    counts = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(
        0, inverse, torch.ones_like(r)
    )
    sums = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(0, inverse, r)
    means = sums / counts
    sq_dev = torch.zeros(n_groups, dtype=torch.float64, device=r.device).index_add_(
        0, inverse, (r - means[inverse]) ** 2
    )
    single = counts < 2
    stds = torch.where(single, torch.ones_like(sq_dev), (sq_dev / (counts - 1).clamp_min(1)).sqrt())
    means = torch.where(single, torch.zeros_like(means), means)
    return means[inverse].to(rewards.dtype), stds[inverse].to(rewards.dtype), counts[inverse]


def _metrics(rewards: Tensor, advantages: Tensor, stds: Tensor, sizes: Tensor) -> Metrics:
    multi = sizes >= 2
    zero_var = (stds == 0) & multi
    return {
        "advantage/mean": advantages.mean() if advantages.numel() else advantages.new_zeros(()),
        "advantage/abs_mean": advantages.abs().mean() if advantages.numel() else advantages.new_zeros(()),
        "reward/zero_std_fraction": zero_var.float().mean()
        if advantages.numel()
        else advantages.new_zeros(()),
    }


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> tuple[Tensor, Metrics]:
    if not eps >= 0:
        raise ValueError(f"eps must be non-negative, got {eps!r}")
    means, stds, sizes = group_mean_std(rewards, group_ids)
    advantages = (rewards - means) / (stds + eps)  # (B,)
    return advantages, _metrics(rewards, advantages, stds, sizes)


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo_advantages(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> tuple[Tensor, Metrics]:
    del eps  # no std in Dr.GRPO; accepted so every estimator shares one signature
    means, stds, sizes = group_mean_std(rewards, group_ids)
    advantages = rewards - means  # (B,)
    return advantages, _metrics(rewards, advantages, stds, sizes)


def compute_advantages(
    name: str, rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6
) -> tuple[Tensor, Metrics]:
    return ADVANTAGE_ESTIMATORS.get(name)(rewards, group_ids, eps=eps)
