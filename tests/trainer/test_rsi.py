"""ALGORITHMS.md §6 and §7.12: the Relative Surprisal Index and RSI-S's keep mask."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from trainer.algos import (
    PolicyLossInputs,
    compute_policy_loss,
    relative_surprisal_index,
    rsi_keep_mask,
    token_stats_from_logits,
)


def test_the_spec_example_keeps_only_the_middle_token() -> None:
    logprob = torch.tensor([[-0.2, -1.0, -5.0]])
    entropy = torch.ones(1, 3)
    assert_close(relative_surprisal_index(-logprob, entropy), torch.tensor([[0.2, 1.0, 5.0]]))
    keep, metrics = rsi_keep_mask(-logprob, entropy, torch.ones(1, 3), mode="fixed", low=0.5, high=2.0)
    assert keep.int().tolist() == [[0, 1, 0]]
    assert_close(metrics["rsi/kept_ratio"], torch.tensor(1 / 3))
    assert_close(metrics["rsi/dropped_low_fraction"], torch.tensor(1 / 3))
    assert_close(metrics["rsi/dropped_high_fraction"], torch.tensor(1 / 3))
    assert_close(metrics["rsi/mean"], torch.tensor(6.2 / 3))


def test_the_spec_example_through_the_loss_masks_the_gradient() -> None:
    logprob = torch.tensor([[-0.2, -1.0, -5.0]], requires_grad=True)
    batch = PolicyLossInputs(
        logprob=logprob,
        old_logprob=logprob.detach().clone(),
        advantages=torch.tensor([1.0]),
        response_mask=torch.ones(1, 3),
        entropy=torch.ones(1, 3),
    )
    loss, _ = compute_policy_loss("rsi_s", batch)
    (grad,) = torch.autograd.grad(loss, logprob)
    # ρ = 1, Â = 1: loss = −1/3 from the kept token; its gradient −1/3, the dropped ones 0.
    assert_close(loss, torch.tensor(-1.0 / 3))
    assert_close(grad, torch.tensor([[0.0, -1.0 / 3, 0.0]]))


def test_bounds_are_inclusive_and_padding_is_never_kept() -> None:
    surprisal = torch.tensor([[1.0, 2.0, 1.0, 1.0]])
    entropy = torch.tensor([[2.0, 1.0, 1.0, 1.0]])  # RSI 0.5, 2.0, 1.0, 1.0 (padding)
    keep, metrics = rsi_keep_mask(
        surprisal, entropy, torch.tensor([[1, 1, 1, 0]]), mode="fixed", low=0.5, high=2.0
    )
    assert keep.tolist() == [[True, True, True, False]]
    assert metrics["rsi/kept_ratio"].item() == 1.0


def test_a_zero_entropy_is_clamped_by_eps() -> None:
    rsi = relative_surprisal_index(torch.tensor([1e-3, 0.0]), torch.tensor([0.0, 0.0]), eps=1e-2)
    assert_close(rsi, torch.tensor([0.1, 0.0]))


@pytest.mark.parametrize(
    "logits",
    [
        [2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, -4.0],
        [0.1, 0.0, -0.1, 0.2, 0.05, -0.2, 0.15, 0.0],
        [5.0, 0.0, 0.0, -1.0, -2.0, -2.0, -6.0, -8.0],
    ],
    ids=["moderate", "flat", "peaked"],
)
def test_rsi_has_mean_one_under_the_policy(logits: list[float]) -> None:
    z = torch.tensor(logits)
    vocab = z.numel()
    stats = token_stats_from_logits(z.expand(vocab, vocab), torch.arange(vocab))
    assert stats.entropy is not None
    rsi_per_token = relative_surprisal_index(-stats.logprob, stats.entropy).double()  # (V,)
    p = stats.logprob.double().exp()
    assert_close((p * rsi_per_token).sum(), torch.tensor(1.0, dtype=torch.float64), atol=1e-6, rtol=0)

    # Monte Carlo at one position: sample tokens a ~ p and average their RSI.
    samples = 100_000
    gen = torch.Generator().manual_seed(len(logits) + int(10 * logits[0]))
    tokens = torch.multinomial(p, samples, replacement=True, generator=gen)
    sampled = token_stats_from_logits(z.expand(samples, vocab), tokens, chunk_rows=8192)
    assert sampled.entropy is not None
    mc_mean = relative_surprisal_index(-sampled.logprob, sampled.entropy).double().mean()
    sd = math.sqrt((p * (rsi_per_token - 1.0) ** 2).sum().item())
    assert abs(mc_mean.item() - 1.0) < 5.0 * sd / math.sqrt(samples)  # CLT, 5 standard errors


@pytest.mark.parametrize("token", range(6))
def test_reinforcing_a_token_raises_entropy_iff_its_rsi_exceeds_one(token: int) -> None:
    z = torch.tensor([1.5, 0.7, 0.2, -0.3, -1.0, -2.5], dtype=torch.float64)
    stats = token_stats_from_logits(z.view(1, -1), torch.tensor([token]))
    assert stats.entropy is not None
    rsi = relative_surprisal_index(-stats.logprob, stats.entropy).item()

    def entropy(logits: torch.Tensor) -> float:
        logp = torch.log_softmax(logits, -1)
        return -(logp.exp() * logp).sum().item()

    bumped = z.clone()
    bumped[token] += 1e-4
    assert math.copysign(1.0, entropy(bumped) - entropy(z)) == math.copysign(1.0, rsi - 1.0)


def test_quantile_mode_on_an_empty_scope_keeps_nothing_and_stays_finite() -> None:
    keep, metrics = rsi_keep_mask(
        torch.ones(2, 3), torch.ones(2, 3), torch.zeros(2, 3), mode="quantile", low=0.1, high=0.9
    )
    assert not keep.any()
    assert all(torch.isfinite(v) for v in metrics.values())


def test_quantile_mode_keeps_the_central_band_of_the_scope() -> None:
    surprisal = torch.arange(1.0, 11.0).view(2, 5)  # RSI 1..10 with H = 1
    keep, _ = rsi_keep_mask(surprisal, torch.ones(2, 5), torch.ones(2, 5), mode="quantile", low=0.2, high=0.8)
    # Quantiles at ranks 1.8 and 7.2 of 0..9: bounds 2.8 and 8.2, so RSI 3..8 are kept.
    assert surprisal[keep].tolist() == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
