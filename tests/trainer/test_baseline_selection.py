"""ALGORITHMS.md §4 and §7.13: the token selections of 80/20, Clip-Cov and KL-Cov, read off the gradient."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from trainer.algos import PolicyLossInputs, compute_policy_loss

# ------------------------------------------------------------------------------------ forking_8020


def forking_batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([10, 8, 6, 9])  # N = 33, ⌈0.2·33⌉ = 7 while 0.2·33 = 6.6
    mask = (torch.arange(10).unsqueeze(0) < lengths.unsqueeze(1)).float()
    logprob = -torch.rand(4, 10, generator=gen) * 3.0
    entropy = torch.randperm(40, generator=gen).float().view(4, 10) / 10 + 0.01  # distinct
    entropy[mask == 0] = 50.0  # padding has the largest entropy: a decoy
    return {
        "logprob": logprob,
        "old_logprob": logprob.clone(),  # ρ = 1: nothing is clipped, every kept token has a gradient
        "advantages": torch.tensor([1.0, -0.5, 2.0, -1.5]),
        "response_mask": mask,
        "entropy": entropy,
    }


def loss_and_grad(
    name: str, batch: dict[str, Any], **overrides: Any
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    logprob = batch["logprob"].clone().requires_grad_(True)
    loss, metrics = compute_policy_loss(name, PolicyLossInputs(**{**batch, "logprob": logprob}), **overrides)
    (grad,) = torch.autograd.grad(loss, logprob)
    return loss, grad, metrics


@pytest.mark.parametrize(("ratio", "kept"), [(0.2, 7), (0.1, 4), (0.5, 17), (1.0, 33)])
def test_forking_8020_trains_on_the_top_entropy_tokens_and_divides_by_all(ratio: float, kept: int) -> None:
    batch = forking_batch()
    mask = batch["response_mask"].bool()
    n_active = int(mask.sum())
    loss, grad, metrics = loss_and_grad("forking_8020", batch, top_entropy_ratio=ratio)

    trained = grad != 0
    assert int(trained.sum()) == kept == math.ceil(round(ratio * n_active, 9))
    assert not (trained & ~mask).any()
    active_entropy = batch["entropy"][mask]
    threshold = active_entropy.sort(descending=True).values[kept - 1]
    assert torch.equal(trained, mask & (batch["entropy"] >= threshold))
    # Each kept token's gradient is −Â/N with N all active tokens (ρ = 1).
    adv = batch["advantages"].unsqueeze(1).expand(4, 10)
    assert_close(grad[trained], -adv[trained] / n_active)
    assert_close(loss, (-adv[trained]).sum() / n_active)
    assert_close(metrics["forking/kept_ratio"], torch.tensor(kept / n_active))


def test_forking_8020_equals_grpo_ds_on_the_kept_tokens_with_the_full_denominator() -> None:
    _, grad_rho1, _ = loss_and_grad("forking_8020", forking_batch())
    kept = grad_rho1 != 0  # the selection does not depend on the ratios
    batch = forking_batch()
    gen = torch.Generator().manual_seed(1)
    batch["old_logprob"] = batch["logprob"] + torch.randn(4, 10, generator=gen) * 0.4  # some clipping
    n_active = float(batch["response_mask"].sum())

    loss, grad, _ = loss_and_grad("forking_8020", batch)
    restricted = {**batch, "response_mask": kept.float(), "global_token_count": n_active}
    expected_loss, expected_grad, _ = loss_and_grad("grpo_ds", restricted)
    assert_close(loss, expected_loss)
    assert_close(grad, expected_grad)


# ------------------------------------------------------------------------------------ Clip-Cov / KL-Cov

# Four responses of six tokens, all active. Â = +2, +2, −2, −2 (mean 0), ℓ = −5 + δ with Σδ = 0, so
# cov = Â·δ exactly. Ratios put 10 of the 14 tokens with 1 < cov < 5 on the clipped side.
ADV = [2.0, 2.0, -2.0, -2.0]
DELTA = [
    [1.0, 1.2, 1.4, 0.1, -0.3, -1.1],  # cov 2.0 2.4 2.8 0.2 −0.6 −2.2
    [1.1, 1.3, 1.5, 1.7, 0.2, 3.0],  # cov 2.2 2.6 3.0 3.4 0.4 6.0
    [-1.0, -1.2, -0.2, 0.3, -2.9, 0.4],  # cov 2.0 2.4 0.4 −0.6 5.8 −0.8
    [-1.1, -1.3, -1.4, -1.2, -0.4, -1.1],  # cov 2.2 2.6 2.8 2.4 0.8 2.2
]
RATIO = [
    [1.1, 1.1, 1.3, 1.1, 1.1, 1.1],  # (0, 2) clipped high
    [1.5, 1.5, 1.5, 1.5, 1.1, 1.1],  # (1, 0..3) clipped high
    [0.9, 0.9, 0.9, 0.9, 0.9, 0.9],
    [0.5, 0.5, 0.5, 0.5, 0.9, 0.6],  # (3, 0..3) and (3, 5) clipped low
]
N = 24


def cov_batch() -> dict[str, torch.Tensor]:
    logprob = torch.tensor([[-5.0 + d for d in row] for row in DELTA])
    log_ratio = torch.tensor([[math.log(r) for r in row] for row in RATIO])
    return {
        "logprob": logprob,
        "old_logprob": logprob - log_ratio,
        "advantages": torch.tensor(ADV),
        "response_mask": torch.ones(4, 6),
    }


def covariances() -> dict[tuple[int, int], float]:
    return {(i, j): ADV[i] * DELTA[i][j] for i in range(4) for j in range(6)}


def clipped(i: int, j: int) -> bool:
    return (ADV[i] > 0 and RATIO[i][j] > 1.2) or (ADV[i] < 0 and RATIO[i][j] < 0.8)


def test_the_covariance_case_is_as_described() -> None:
    assert abs(sum(sum(row) for row in DELTA)) < 1e-12
    window = {key for key, c in covariances().items() if 1 < c < 5}
    assert len(window) == 14
    assert sorted(key for key in window if not clipped(*key)) == [(0, 0), (0, 1), (2, 0), (2, 1)]


@pytest.mark.parametrize("seed", range(12))
def test_clip_cov_zeroes_exactly_k_unclipped_tokens_from_the_window(seed: int) -> None:
    batch = cov_batch()
    generator = torch.Generator().manual_seed(seed)
    # clip_cov_ratio 0.125: k = max(1, ⌊0.125·24⌋) = 3 of the 4 eligible tokens.
    loss, grad, metrics = loss_and_grad("clip_cov", {**batch, "generator": generator}, clip_cov_ratio=0.125)

    eligible = {key for key, c in covariances().items() if 1 < c < 5 and not clipped(*key)}
    zero_grad = {(i, j) for i in range(4) for j in range(6) if grad[i, j] == 0}
    zeroed = {key for key in zero_grad if not clipped(*key)}
    assert len(zeroed) == 3
    assert zeroed <= eligible
    assert zero_grad - zeroed == {key for key in covariances() if clipped(*key)}
    # The loss drops exactly the zeroed tokens (a clipped token zeroed instead would change it).
    per_token = {
        (i, j): max(-ADV[i] * RATIO[i][j], -ADV[i] * min(max(RATIO[i][j], 0.8), 1.2))
        for i in range(4)
        for j in range(6)
    }
    expected = sum(v for key, v in per_token.items() if key not in zeroed) / N
    assert_close(loss, torch.tensor(expected), atol=1e-6, rtol=1e-5)
    assert_close(metrics["clip_cov/zeroed_fraction"], torch.tensor(3 / N))
    assert_close(metrics["clip_cov/window_fraction"], torch.tensor(4 / N))


def test_clip_cov_picks_at_random() -> None:
    picks = set()
    for seed in range(12):
        _, grad, _ = loss_and_grad(
            "clip_cov",
            {**cov_batch(), "generator": torch.Generator().manual_seed(seed)},
            clip_cov_ratio=0.125,
        )
        picks.add(
            frozenset((i, j) for i in range(4) for j in range(6) if grad[i, j] == 0 and not clipped(i, j))
        )
    assert len(picks) > 1


def test_clip_cov_default_ratio_zeroes_one_token_and_a_small_window_is_zeroed_whole() -> None:
    _, grad, _ = loss_and_grad("clip_cov", cov_batch())  # max(1, ⌊2e-4·24⌋) = 1
    assert sum(1 for i in range(4) for j in range(6) if grad[i, j] == 0 and not clipped(i, j)) == 1
    _, grad, _ = loss_and_grad("clip_cov", cov_batch(), clip_cov_ratio=0.5)  # k = 12 > 4 eligible
    zeroed = {(i, j) for i in range(4) for j in range(6) if grad[i, j] == 0 and not clipped(i, j)}
    assert zeroed == {(0, 0), (0, 1), (2, 0), (2, 1)}


def test_clip_cov_window_bounds_are_parameters() -> None:
    # Window (5, 7): only (1, 5) with cov 6.0 and (2, 4) with 5.8, both unclipped.
    _, grad, _ = loss_and_grad("clip_cov", cov_batch(), clip_cov_ratio=0.5, cov_lower=5.0, cov_upper=7.0)
    zeroed = {(i, j) for i in range(4) for j in range(6) if grad[i, j] == 0 and not clipped(i, j)}
    assert zeroed == {(1, 5), (2, 4)}


@pytest.mark.parametrize(("ratio", "count"), [(2e-3, 1), (0.125, 3), (0.2, 4), (0.0, 1)])
def test_kl_cov_penalises_exactly_the_top_k_covariance_tokens(ratio: float, count: int) -> None:
    batch = cov_batch()
    loss, grad, metrics = loss_and_grad("kl_cov", batch, kl_cov_ratio=ratio, kl_cov_coef=0.5)

    cov = covariances()
    top = set(sorted(cov, key=lambda key: cov[key], reverse=True)[:count])
    # −Âρ unclipped everywhere; on the penalised tokens + 0.5·|ℓ − ℓ_old|, whose ℓ-gradient is 0.5·sign.
    expected_grad = torch.tensor(
        [
            [
                (
                    -ADV[i] * RATIO[i][j]
                    + (0.5 * math.copysign(1.0, math.log(RATIO[i][j])) if (i, j) in top else 0.0)
                )
                / N
                for j in range(6)
            ]
            for i in range(4)
        ]
    )
    assert_close(grad, expected_grad, atol=1e-6, rtol=1e-5)
    expected_loss = (
        sum(
            -ADV[i] * RATIO[i][j] + (0.5 * abs(math.log(RATIO[i][j])) if (i, j) in top else 0.0)
            for i, j in cov
        )
        / N
    )
    assert_close(loss, torch.tensor(expected_loss), atol=1e-6, rtol=1e-5)
    assert_close(metrics["kl_cov/penalised_fraction"], torch.tensor(count / N))


@pytest.mark.parametrize(
    ("padded_rows", "ratio", "count"),
    [((0, 1, 2, 3), 0.1, 1), ((0, 1, 2, 3), 0.5, 8), ((2, 3), 0.15, 3), ((2, 3), 0.4, 8)],
)
def test_kl_cov_covariance_uses_active_tokens_only(
    padded_rows: tuple[int, ...], ratio: float, count: int
) -> None:
    batch = cov_batch()
    # Pad the last two tokens of some responses and give them very low log-probs: means of ℓ or Â taken
    # over padding would shift every covariance and change the ranking (checked for these k).
    for i in padded_rows:
        batch["response_mask"][i, 4:] = 0
        batch["logprob"][i, 4:] = -40.0
    n_active = int(batch["response_mask"].sum())
    _, grad, _ = loss_and_grad("kl_cov", batch, kl_cov_ratio=ratio, kl_cov_coef=0.5)  # k = ⌊ratio·N⌋

    active = [(i, j) for i in range(4) for j in range(6) if batch["response_mask"][i, j] == 1]
    mean_adv = sum(ADV[i] for i, _ in active) / n_active
    mean_lp = sum(-5.0 + DELTA[i][j] for i, j in active) / n_active
    cov = {(i, j): (ADV[i] - mean_adv) * (-5.0 + DELTA[i][j] - mean_lp) for i, j in active}
    top = set(sorted(cov, key=lambda key: cov[key], reverse=True)[:count])
    penalised = {
        (i, j) for i, j in active if abs(grad[i, j].item() - (-ADV[i] * RATIO[i][j] / n_active)) > 1e-6
    }
    assert penalised == top
    assert all(grad[i, 4:].eq(0).all() for i in padded_rows)
