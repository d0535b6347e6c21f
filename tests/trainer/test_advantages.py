"""ALGORITHMS.md §3: GRPO and Dr.GRPO advantages, hand-computed, over contiguous and scattered groups."""

from __future__ import annotations

import statistics

import pytest
import torch
from torch.testing import assert_close

from trainer.algos import ADVANTAGE_ESTIMATORS, compute_advantages, group_mean_std

DTYPES = [torch.float32, torch.float64]


def grpo_by_hand(rewards: list[float], groups: list[int], eps: float = 1e-6) -> list[float]:
    out = []
    for r, g in zip(rewards, groups):
        members = [x for x, h in zip(rewards, groups) if h == g]
        if len(members) == 1:
            out.append(r / (1.0 + eps))
        else:
            out.append((r - statistics.fmean(members)) / (statistics.stdev(members) + eps))
    return out


def dr_grpo_by_hand(rewards: list[float], groups: list[int]) -> list[float]:
    out = []
    for r, g in zip(rewards, groups):
        members = [x for x, h in zip(rewards, groups) if h == g]
        out.append(r if len(members) == 1 else r - statistics.fmean(members))
    return out


def test_registry_holds_exactly_the_documented_estimators() -> None:
    assert ADVANTAGE_ESTIMATORS.names() == ["dr_grpo", "grpo"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_grpo_uses_the_unbiased_std_and_eps_1e_6(dtype: torch.dtype) -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    advantages, _ = compute_advantages("grpo", torch.tensor(rewards, dtype=dtype), torch.tensor(groups))
    # Group 0: mean 0.5, unbiased std sqrt(1/3); group 1: mean 0.25, std 0.5.
    a0 = 0.5 / ((1.0 / 3.0) ** 0.5 + 1e-6)
    expected = [a0, -a0, -a0, a0, 0.75 / (0.5 + 1e-6)] + [-0.25 / (0.5 + 1e-6)] * 3
    assert advantages.dtype == dtype
    assert_close(advantages, torch.tensor(expected, dtype=dtype))
    assert_close(advantages, torch.tensor(grpo_by_hand(rewards, groups), dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_grpo_on_non_binary_rewards_matches_the_hand_formula(dtype: torch.dtype) -> None:
    rewards = [0.3, -1.2, 2.5, 0.7, 0.0, 4.0]
    groups = [5, 5, 5, 2, 2, 2]
    advantages, _ = compute_advantages("grpo", torch.tensor(rewards, dtype=dtype), torch.tensor(groups))
    assert_close(advantages, torch.tensor(grpo_by_hand(rewards, groups), dtype=dtype))


@pytest.mark.parametrize("reward", [1.0, 0.0, -2.5])
@pytest.mark.parametrize("name", ["grpo", "dr_grpo"])
def test_a_group_of_one_keeps_its_reward(reward: float, name: str) -> None:
    rewards = torch.tensor([reward, 1.0, 0.0], dtype=torch.float64)
    advantages, _ = compute_advantages(name, rewards, torch.tensor([9, 4, 4]))
    expected = reward / (1.0 + 1e-6) if name == "grpo" else reward
    assert advantages[0].item() == pytest.approx(expected, rel=1e-12, abs=0.0)
    means, stds, sizes = group_mean_std(rewards, torch.tensor([9, 4, 4]))
    assert (means[0].item(), stds[0].item(), sizes[0].item()) == (0.0, 1.0, 1.0)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo"])
@pytest.mark.parametrize("value", [0.0, 1.0, 0.37])
def test_all_equal_rewards_give_zero_advantage(name: str, value: float) -> None:
    rewards = torch.tensor([value] * 4 + [1.0, 0.0], dtype=torch.float32)
    advantages, metrics = compute_advantages(name, rewards, torch.tensor([0, 0, 0, 0, 1, 1]))
    assert torch.equal(advantages[:4], torch.zeros(4))
    assert (advantages[4:] != 0).all()
    assert metrics["reward/zero_std_fraction"].item() == pytest.approx(4 / 6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dr_grpo_is_reward_minus_group_mean(dtype: torch.dtype) -> None:
    rewards = [1.0, 0.0, 0.0, 3.0, 2.0, -1.0]
    groups = [1, 1, 1, 0, 0, 0]
    advantages, _ = compute_advantages("dr_grpo", torch.tensor(rewards, dtype=dtype), torch.tensor(groups))
    expected = [1 - 1 / 3, -1 / 3, -1 / 3, 3 - 4 / 3, 2 - 4 / 3, -1 - 4 / 3]
    assert_close(advantages, torch.tensor(expected, dtype=dtype))
    assert_close(advantages, torch.tensor(dr_grpo_by_hand(rewards, groups), dtype=dtype))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo"])
def test_scattered_group_ids_give_the_same_advantages_as_a_contiguous_layout(name: str) -> None:
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.5, 0.0, 1.0, 0.25, 2.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    contiguous, _ = compute_advantages(name, rewards, groups)

    order = torch.tensor([5, 0, 7, 3, 1, 6, 4, 2])
    relabel = torch.tensor([1000, -3, 17])  # non-contiguous, unsorted, negative ids
    scattered, _ = compute_advantages(name, rewards[order], relabel[groups[order]])
    assert_close(scattered, contiguous[order])
    if name == "grpo":
        expected = grpo_by_hand(rewards[order].tolist(), relabel[groups[order]].tolist())
    else:
        expected = dr_grpo_by_hand(rewards[order].tolist(), relabel[groups[order]].tolist())
    assert_close(scattered, torch.tensor(expected))


def test_eps_is_a_parameter_of_grpo() -> None:
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    advantages, _ = compute_advantages("grpo", rewards, torch.tensor([0, 0]), eps=0.5)
    std = 2**-0.5
    assert_close(advantages, torch.tensor([0.5 / (std + 0.5), -0.5 / (std + 0.5)], dtype=torch.float64))


def test_advantage_metrics_are_hand_computed() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 5.0])
    advantages, metrics = compute_advantages("dr_grpo", rewards, torch.tensor([0, 0, 1, 1, 2]))
    assert_close(advantages, torch.tensor([0.5, -0.5, 0.0, 0.0, 5.0]))
    assert_close(metrics["advantage/mean"], torch.tensor(1.0))
    assert_close(metrics["advantage/abs_mean"], torch.tensor(6.0 / 5))
    # Only multi-member groups count as zero-variance: group 1 (2 of 5 responses).
    assert_close(metrics["reward/zero_std_fraction"], torch.tensor(2.0 / 5))


def test_an_empty_batch_gives_empty_advantages_and_finite_metrics() -> None:
    advantages, metrics = compute_advantages("grpo", torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert advantages.shape == (0,)
    assert all(torch.isfinite(v).all() for v in metrics.values())
