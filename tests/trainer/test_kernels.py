"""ALGORITHMS.md §2 and §7.5: the chunked log-prob/entropy/C(p) kernels equal the naive full-tensor
computation, for values and for the log-prob's gradient, at every chunk size and temperature."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from trainer.algos import (
    TokenStats,
    token_stats_from_logits,
    token_stats_reference,
)

FP32_TOL = {"atol": 1e-5, "rtol": 1e-5}
# (lead shape, vocabulary) pairs; 21 and 13 rows are not divisible by most chunk sizes below.
SHAPES = [((21,), 17), ((3, 7), 33), ((1, 13), 5)]
CHUNKS = [1, 4, 5, 8, 1024]
TEMPERATURES = [1.0, 0.6, 1.7]


def make_logits(lead: tuple[int, ...], vocab: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn((*lead, vocab), generator=gen) * 3.0).to(dtype)


def make_targets(lead: tuple[int, ...], vocab: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, lead, generator=gen)


def assert_stats_equal(actual: TokenStats, expected: TokenStats, **tol: float) -> None:
    assert actual.entropy is not None and actual.correction is not None
    assert expected.entropy is not None and expected.correction is not None
    for value in (actual.logprob, actual.entropy, actual.correction):
        assert value.dtype == torch.float32
        assert value.shape == expected.logprob.shape
    assert_close(actual.logprob, expected.logprob, **tol)
    assert_close(actual.entropy, expected.entropy, **tol)
    assert_close(actual.correction, expected.correction, **tol)


def naive_logprob(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


# ---------------------------------------------------------------------------------- from logits


@pytest.mark.parametrize(("lead", "vocab"), SHAPES)
@pytest.mark.parametrize("chunk_rows", CHUNKS)
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_chunked_logit_kernel_equals_the_reference_fp32(
    lead: tuple[int, ...], vocab: int, chunk_rows: int, temperature: float
) -> None:
    logits = make_logits(lead, vocab, torch.float32)
    targets = make_targets(lead, vocab)
    stats = token_stats_from_logits(logits, targets, temperature=temperature, chunk_rows=chunk_rows)
    assert_stats_equal(stats, token_stats_reference(logits, targets, temperature=temperature), **FP32_TOL)


def test_reference_divides_by_temperature_before_everything() -> None:
    logits = make_logits((4,), 9, torch.float32)
    targets = make_targets((4,), 9)
    hot = token_stats_reference(logits, targets, temperature=2.0)
    scaled = token_stats_reference(logits / 2.0, targets)
    assert_stats_equal(hot, scaled, **FP32_TOL)
    # And the chunked kernel at T equals the kernel on z/T at T = 1.
    assert_stats_equal(
        token_stats_from_logits(logits, targets, temperature=2.0, chunk_rows=3),
        token_stats_from_logits(logits / 2.0, targets, chunk_rows=3),
        **FP32_TOL,
    )


def test_reference_values_match_a_hand_computed_row() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    stats = token_stats_reference(logits, torch.tensor([2]))
    total = math.exp(0.0) + math.exp(1.0) + math.exp(2.0)
    p = [math.exp(v) / total for v in (0.0, 1.0, 2.0)]
    s = [-math.log(pk) for pk in p]
    entropy = sum(pk * sk for pk, sk in zip(p, s))
    correction = sum(pk * pk * (sk - entropy) for pk, sk in zip(p, s))
    assert stats.entropy is not None and stats.correction is not None
    assert_close(stats.logprob, torch.tensor([-s[2]]), **FP32_TOL)
    assert_close(stats.entropy, torch.tensor([entropy]), **FP32_TOL)
    assert_close(stats.correction, torch.tensor([correction]), **FP32_TOL)


@pytest.mark.parametrize(("lead", "vocab"), SHAPES)
@pytest.mark.parametrize("chunk_rows", [1, 5, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_logit_kernel_on_bf16_equals_the_reference_on_the_same_values(
    lead: tuple[int, ...], vocab: int, chunk_rows: int, temperature: float
) -> None:
    logits = make_logits(lead, vocab, torch.bfloat16)
    targets = make_targets(lead, vocab)
    stats = token_stats_from_logits(logits, targets, temperature=temperature, chunk_rows=chunk_rows)
    assert_stats_equal(stats, token_stats_reference(logits, targets, temperature=temperature), **FP32_TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_rows", [1, 4, 1024])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_logprob_gradient_matches_autograd_of_the_naive_version(
    dtype: torch.dtype, chunk_rows: int, temperature: float
) -> None:
    lead, vocab = (3, 7), 19
    logits = make_logits(lead, vocab, dtype).requires_grad_(True)
    targets = make_targets(lead, vocab)
    upstream = torch.randn(lead, generator=torch.Generator().manual_seed(5))

    stats = token_stats_from_logits(logits, targets, temperature=temperature, chunk_rows=chunk_rows)
    (grad,) = torch.autograd.grad((stats.logprob * upstream).sum(), logits)
    (expected,) = torch.autograd.grad((naive_logprob(logits, targets, temperature) * upstream).sum(), logits)

    assert grad.dtype == dtype
    if dtype == torch.float32:
        assert_close(grad, expected, **FP32_TOL)
    else:
        assert_close(grad, expected)  # both rounded to bf16 from fp32


def test_logprob_gradient_flows_through_a_non_contiguous_slice() -> None:
    full = make_logits((2, 6), 11, torch.float32).requires_grad_(True)
    logits = full[:, :-1]  # (2, 5, V), the usual next-token slice: not contiguous
    targets = make_targets((2, 5), 11)
    stats = token_stats_from_logits(logits, targets, chunk_rows=3)
    (grad,) = torch.autograd.grad(stats.logprob.sum(), full)
    (expected,) = torch.autograd.grad(naive_logprob(logits, targets, 1.0).sum(), full)
    assert_close(grad, expected, **FP32_TOL)
    assert torch.equal(grad[:, -1], torch.zeros_like(grad[:, -1]))


def test_entropy_and_correction_carry_no_gradient() -> None:
    logits = make_logits((4,), 9, torch.float32).requires_grad_(True)
    stats = token_stats_from_logits(logits, make_targets((4,), 9))
    assert stats.entropy is not None and stats.correction is not None
    assert stats.logprob.requires_grad
    assert not stats.entropy.requires_grad
    assert not stats.correction.requires_grad
    reference = token_stats_reference(logits, make_targets((4,), 9))
    assert reference.entropy is not None and reference.correction is not None
    assert not reference.entropy.requires_grad
    assert not reference.correction.requires_grad


def test_optional_outputs_are_skipped_without_changing_the_logprob() -> None:
    logits = make_logits((6,), 13, torch.float32)
    targets = make_targets((6,), 13)
    only_logprob = token_stats_from_logits(logits, targets, with_entropy=False, with_correction=False)
    entropy_only = token_stats_from_logits(logits, targets, with_correction=False)
    full = token_stats_from_logits(logits, targets)
    assert only_logprob.entropy is None and only_logprob.correction is None
    assert entropy_only.correction is None and entropy_only.entropy is not None
    assert torch.equal(only_logprob.logprob, full.logprob)
    assert full.entropy is not None
    assert torch.equal(entropy_only.entropy, full.entropy)


def test_kernel_does_not_modify_its_inputs() -> None:
    logits = make_logits((5,), 7, torch.float32)
    before = logits.clone()
    token_stats_from_logits(logits, make_targets((5,), 7), temperature=0.5, chunk_rows=2)
    assert torch.equal(logits, before)


# ---------------------------------------------------------------------------------- from hidden


def make_head(
    rows: int, dim: int, vocab: int, dtype: torch.dtype, bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(11)
    hidden = torch.randn(rows, dim, generator=gen).to(dtype)
    weight = (torch.randn(vocab, dim, generator=gen) / dim**0.5 * 2.0).to(dtype)
    head_bias = torch.randn(vocab, generator=gen).to(dtype) if bias else None
    return hidden, weight, head_bias
