"""Property tests over shape and mask edge cases: all-padding rows, groups of one, all-equal rewards,
Â = 0 everywhere, a single active token, bf16 inputs. Every loss must return a finite scalar with finite
gradients that vanish on masked positions, finite metrics, and must ignore what padding holds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from trainer.algos import (
    POLICY_LOSSES,
    PolicyLossInputs,
    StareControllerState,
    compute_advantages,
    compute_policy_loss,
    token_stats_from_logits,
    token_stats_reference,
)

# Every registered loss, with its defaults and with the variants that change its code path.
LOSS_VARIANTS: list[tuple[str, dict[str, Any]]] = [(name, {}) for name in POLICY_LOSSES.names()] + [
    ("grpo", {"kl_beta": 0.1}),
    ("grpo_ds", {"kl_beta": 0.1}),
    ("stare", {"variant": "C2", "top_ratio": 0.5}),
    ("stare", {"control": StareControllerState(gate_on=False, reweight_w=1.1, reweight_m=0.9)}),
    ("rsi_s", {"bound_mode": "quantile", "r_lo": 0.1, "r_hi": 0.9}),
    ("rsi_s", {"denominator": "kept", "kl_beta": 0.1}),
    ("forking_8020", {"top_entropy_ratio": 1.0}),
    ("clip_cov", {"clip_cov_ratio": 0.5, "cov_lower": -10.0, "cov_upper": 10.0}),
    ("kl_cov", {"kl_cov_ratio": 0.5}),
]


@dataclass(frozen=True)
class Case:
    fields: dict[str, torch.Tensor]
    dtype: torch.dtype


def floats(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(low, high, allow_nan=False, allow_infinity=False, width=32)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    rows = draw(st.integers(1, 4))
    cols = draw(st.integers(1, 6))
    size = rows * cols
    mask_kind = draw(st.sampled_from(["lengths", "single", "none", "random"]))
    if mask_kind == "lengths":  # right padding; 0-length rows are all padding
        lengths = torch.tensor(draw(st.lists(st.integers(0, cols), min_size=rows, max_size=rows)))
        mask = (torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(1)).float()
    elif mask_kind == "single":
        mask = torch.zeros(size)
        mask[draw(st.integers(0, size - 1))] = 1.0
        mask = mask.view(rows, cols)
    elif mask_kind == "none":
        mask = torch.zeros(rows, cols)
    else:
        mask = (
            torch.tensor(draw(st.lists(st.booleans(), min_size=size, max_size=size))).float().view(rows, cols)
        )

    adv_kind = draw(st.sampled_from(["zero", "grpo", "equal", "random"]))
    if adv_kind == "zero":
        advantages = torch.zeros(rows)
    elif adv_kind in ("grpo", "equal"):
        group_ids = torch.tensor(draw(st.lists(st.integers(0, rows - 1), min_size=rows, max_size=rows)))
        rewards = (
            torch.ones(rows)
            if adv_kind == "equal"
            else torch.tensor(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=rows, max_size=rows)))
        )
        advantages, _ = compute_advantages("grpo", rewards, group_ids)
    else:
        advantages = torch.tensor(draw(st.lists(floats(-3.0, 3.0), min_size=rows, max_size=rows)))

    def grid(low: float, high: float) -> torch.Tensor:
        return torch.tensor(draw(st.lists(floats(low, high), min_size=size, max_size=size))).view(rows, cols)

    old = grid(-12.0, 0.0)
    return Case(
        fields={
            "logprob": old + grid(-4.0, 4.0),
            "old_logprob": old,
            "advantages": advantages,
            "response_mask": mask,
            "entropy": grid(0.0, 6.0),
            "ref_logprob": old + grid(-4.0, 4.0),
        },
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
    )


def run(
    name: str, overrides: dict[str, Any], fields: dict[str, torch.Tensor], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    logprob = fields["logprob"].to(dtype).requires_grad_(True)
    inputs = PolicyLossInputs(**{**fields, "logprob": logprob, "generator": torch.Generator().manual_seed(0)})
    loss, metrics = compute_policy_loss(name, inputs, **overrides)
    (grad,) = torch.autograd.grad(loss, logprob)
    return loss, grad, metrics


@given(cases())
def test_every_loss_is_finite_with_finite_gradients_that_vanish_on_padding(case: Case) -> None:
    mask = case.fields["response_mask"].bool()
    for name, overrides in LOSS_VARIANTS:
        loss, grad, metrics = run(name, overrides, case.fields, case.dtype)
        assert loss.dim() == 0 and torch.isfinite(loss), name
        assert grad.dtype == case.dtype
        assert torch.isfinite(grad).all(), name
        assert (grad[~mask] == 0).all(), name
        for key, value in metrics.items():
            assert value.dim() == 0 and torch.isfinite(value), (name, key)
            assert not value.requires_grad, (name, key)
        if not mask.any():
            assert loss.item() == 0.0, name


@given(cases(), st.data())
def test_what_padding_holds_never_changes_the_loss(case: Case, data: st.DataObject) -> None:
    mask = case.fields["response_mask"].bool()
    scrambled = dict(case.fields)
    for key, low, high in (("logprob", -12.0, 0.0), ("old_logprob", -12.0, 0.0), ("entropy", 0.0, 9.0)):
        noise = torch.tensor(
            data.draw(st.lists(floats(low, high), min_size=mask.numel(), max_size=mask.numel()))
        )
        scrambled[key] = torch.where(mask, case.fields[key], noise.view(mask.shape))
    for name, overrides in LOSS_VARIANTS:
        loss, grad, _ = run(name, overrides, case.fields, case.dtype)
        loss_scrambled, grad_scrambled, _ = run(name, overrides, scrambled, case.dtype)
        assert_close(loss_scrambled, loss, msg=name)
        assert_close(grad_scrambled, grad, msg=name)


@given(cases())
def test_zero_advantage_everywhere_gives_a_zero_policy_gradient(case: Case) -> None:
    fields = {**case.fields, "advantages": torch.zeros_like(case.fields["advantages"])}
    for name, overrides in LOSS_VARIANTS:
        if overrides.get("kl_beta") or name == "kl_cov":
            continue  # penalties pull on ℓ without any advantage
        loss, grad, _ = run(name, overrides, fields, case.dtype)
        assert loss.item() == 0.0, name
        assert (grad == 0).all(), name


@given(
    rows=st.integers(1, 9),
    vocab=st.integers(2, 12),
    chunk_rows=st.integers(1, 10),
    temperature=st.floats(0.25, 3.0),
    scale=st.floats(0.0, 8.0),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_chunked_kernel_equals_the_reference_for_any_chunking(
    rows: int, vocab: int, chunk_rows: int, temperature: float, scale: float, dtype: torch.dtype, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, vocab, generator=gen) * scale).to(dtype)
    targets = torch.randint(0, vocab, (rows,), generator=gen)
    stats = token_stats_from_logits(logits, targets, temperature=temperature, chunk_rows=chunk_rows)
    expected = token_stats_reference(logits, targets, temperature=temperature)
    assert stats.entropy is not None and stats.correction is not None
    assert expected.entropy is not None and expected.correction is not None
    assert_close(stats.logprob, expected.logprob, atol=1e-5, rtol=1e-5)
    assert_close(stats.entropy, expected.entropy, atol=1e-5, rtol=1e-5)
    assert_close(stats.correction, expected.correction, atol=1e-5, rtol=1e-5)
    assert (stats.correction <= 1e-6).all()
    assert (stats.entropy >= -1e-6).all()
