"""ALGORITHMS.md §4 (dapo, dynamic sampling): DAPO's soft overlong penalty and the informative-group filter."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from trainer.algos import informative_groups, overlong_penalty


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
def test_overlong_penalty_at_and_around_its_boundaries(dtype: torch.dtype) -> None:
    # L_max = 20, L_cache = 4: free up to 16, a linear ramp to −1 at 20, −1 beyond.
    lengths = torch.tensor([0, 15, 16, 17, 18, 19, 20, 21, 100]).to(dtype)
    penalty = overlong_penalty(lengths, max_length=20, cache_length=4)
    expected = torch.tensor([0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0, -1.0])
    assert_close(penalty, expected)


def test_overlong_penalty_with_the_buffer_equal_to_the_budget() -> None:
    penalty = overlong_penalty(torch.tensor([0, 1, 5, 10, 11]), max_length=10, cache_length=10)
    assert_close(penalty, torch.tensor([0.0, -0.1, -0.5, -1.0, -1.0]))


def test_overlong_penalty_keeps_the_batch_shape() -> None:
    lengths = torch.tensor([[4, 9], [10, 12]])
    penalty = overlong_penalty(lengths, max_length=10, cache_length=2)
    assert_close(penalty, torch.tensor([[0.0, -0.5], [-1.0, -1.0]]))


def test_binary_informative_groups_drop_constant_groups_and_singletons() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    group_ids = torch.tensor([3, 3, 3, 8, 8, 8, 5, 1, 1])  # group 5 is a singleton, group 1 all zero
    kept = informative_groups(rewards, group_ids, binary=True)
    assert kept.tolist() == [False, False, False, True, True, True, False, False, False]


def test_binary_mode_compares_rewards_exactly() -> None:
    rewards = torch.tensor([0.5, 0.5 + 1e-9], dtype=torch.float64)
    assert informative_groups(rewards, torch.tensor([0, 0]), binary=True).tolist() == [True, True]
    assert informative_groups(rewards, torch.tensor([0, 0]), binary=False).tolist() == [False, False]


@pytest.mark.parametrize(
    ("rewards", "std_tol", "expected"),
    [
        ([0.5, 0.6, 0.7], 1e-6, True),  # unbiased std 0.1
        ([0.5, 0.6, 0.7], 0.09, True),
        ([0.5, 0.6, 0.7], 0.11, False),
        ([2.0, 2.0, 2.0], 1e-6, False),
        ([2.0, 2.0 + 1e-9, 2.0], 1e-6, False),
    ],
)
def test_tolerance_mode_compares_the_group_std_with_the_tolerance(
    rewards: list[float], std_tol: float, expected: bool
) -> None:
    kept = informative_groups(
        torch.tensor(rewards, dtype=torch.float64),
        torch.zeros(3, dtype=torch.long),
        binary=False,
        std_tol=std_tol,
    )
    assert kept.tolist() == [expected] * 3
