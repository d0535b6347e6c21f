"""ALGORITHMS.md §4 aggregations, hand-computed, and §7.6: a token-mean loss and its gradient do not
depend on how the optimiser-step batch is split into micro-batches (the 2-process half of §7.6 is tested
with the distributed loop, not here)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing import assert_close

from trainer.algos import AggMode, PolicyLossInputs, aggregate, compute_policy_loss, make_loss_params
from trainer.algos.stare import StareControllerState, stare_weights

# 2 × 3, second response has one padding position.
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_token_mean_divides_by_the_active_token_count() -> None:
    assert_close(aggregate(PER_TOKEN, MASK, "token-mean"), torch.tensor(15.0 / 5))
    assert_close(aggregate(PER_TOKEN, MASK, AggMode.TOKEN_MEAN, global_token_count=10), torch.tensor(1.5))


def test_seq_mean_token_mean_averages_per_response_means() -> None:
    assert_close(aggregate(PER_TOKEN, MASK, "seq-mean-token-mean"), torch.tensor((2.0 + 4.5) / 2))
    assert_close(
        aggregate(PER_TOKEN, MASK, "seq-mean-token-mean", global_sequence_count=4), torch.tensor(6.5 / 4)
    )


def test_seq_mean_token_sum_norm_divides_by_responses_times_budget() -> None:
    assert_close(aggregate(PER_TOKEN, MASK, "seq-mean-token-sum-norm"), torch.tensor(15.0 / (2 * 3)))
    assert_close(
        aggregate(PER_TOKEN, MASK, "seq-mean-token-sum-norm", global_sequence_count=4, max_response_length=5),
        torch.tensor(15.0 / 20),
    )


@pytest.mark.parametrize("mode", list(AggMode))
def test_an_all_padding_batch_aggregates_to_zero_not_nan(mode: AggMode) -> None:
    loss = aggregate(PER_TOKEN, torch.zeros_like(MASK), mode)
    assert torch.equal(loss, torch.tensor(0.0))


@pytest.mark.parametrize("mode", list(AggMode))
def test_masked_positions_get_no_gradient(mode: AggMode) -> None:
    per_token = PER_TOKEN.clone().requires_grad_(True)
    aggregate(per_token, MASK, mode).backward()
    assert per_token.grad is not None
    assert per_token.grad[1, 2].item() == 0.0
    assert (per_token.grad[MASK.bool()] > 0).all()


# ------------------------------------------------------------------------------ §7.6 split invariance

B, T = 6, 7
SPLITS = [
    [[0, 1, 2, 3, 4, 5]],
    [[0, 1], [2, 3], [4, 5]],
    [[0], [1, 2, 3, 4, 5]],
    [[0, 1, 2, 3, 4], [5]],
    [[0], [1], [2], [3], [4], [5]],
]


def step_batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    old = -torch.rand(B, T, generator=gen) * 3.0 - 0.05
    # Log-ratios wide enough that both clip bounds and the dual clip are active somewhere.
    log_ratio = torch.randn(B, T, generator=gen) * 0.6
    log_ratio[1, 2] = 2.6  # ρ ≈ 13 on a negative-advantage row: dual clip
    lengths = torch.tensor([7, 3, 0, 5, 1, 6])  # an all-padding response and a single-token one
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).float()
    return {
        "logprob": old + log_ratio,
        "old_logprob": old,
        "advantages": torch.tensor([1.3, -0.8, 0.5, -1.1, 2.0, 0.0]),
        "response_mask": mask,
        "entropy": torch.rand(B, T, generator=gen) * 2.0 + 0.05,
        "ref_logprob": old + torch.randn(B, T, generator=gen) * 0.2,
    }


def loss_and_grad(
    name: str, overrides: dict[str, Any], split: list[list[int]], with_weights: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    batch = step_batch()
    control = overrides.get("control")  # the controller state, for the loss; the rest are parameters
    params = make_loss_params(name, **{k: v for k, v in overrides.items() if k != "control"})
    logprob = batch["logprob"].clone().requires_grad_(True)
    n_tokens = float(batch["response_mask"].sum())
    weights = None
    if with_weights:  # STARE ω selected over the whole step batch (scope "step_batch")
        weights, _ = stare_weights(
            -batch["logprob"], batch["advantages"], batch["response_mask"],
            top_ratio=0.2, reweight_w=1.1, reweight_m=0.9, variant="C2", gate_on=True,
        )  # fmt: skip
    total = torch.zeros(())
    for rows in split:
        idx = torch.tensor(rows)
        inputs = PolicyLossInputs(
            logprob=logprob[idx],
            old_logprob=batch["old_logprob"][idx],
            advantages=batch["advantages"][idx],
            response_mask=batch["response_mask"][idx],
            entropy=batch["entropy"][idx],
            ref_logprob=batch["ref_logprob"][idx],
            token_weights=None if weights is None else weights[idx],
            global_token_count=n_tokens,
            global_sequence_count=float(B),
            max_response_length=T + 3,
        )
        loss, _ = compute_policy_loss(name, inputs, params, control=control)
        total = total + loss
    (grad,) = torch.autograd.grad(total, logprob)
    return total.detach(), grad


# Every token-mean loss. Losses whose token selection is defined per micro-batch (stare's default
# scope, forking_8020, clip_cov, kl_cov) are run with selection-neutral parameters or a step-wide
# selection, so that what is tested is the aggregation.
SPLIT_INVARIANT_CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("grpo_ds", {}, False),
    ("grpo_ds", {"kl_beta": 0.05}, False),
    ("dapo", {}, False),
    ("stare", {"scope": "step_batch", "variant": "C2"}, True),
    ("stare", {"control": StareControllerState(gate_on=False, reweight_w=1.1, reweight_m=0.9)}, False),
    ("rsi_s", {}, False),
    ("rsi_s", {"r_lo": 0.1, "r_hi": 3.0, "kl_beta": 0.1}, False),
    ("forking_8020", {"top_entropy_ratio": 1.0}, False),
    ("clip_cov", {"cov_lower": 100.0, "cov_upper": 100.0}, False),
    ("kl_cov", {"kl_cov_coef": 0.0}, False),
    ("grpo", {"agg_mode": "token-mean"}, False),
    # The sequence-level modes with the step's sequence count and generation budget.
    ("grpo", {}, False),
    ("grpo", {"kl_beta": 0.1}, False),
    ("dr_grpo", {}, False),
]


@pytest.mark.parametrize(("name", "overrides", "with_weights"), SPLIT_INVARIANT_CASES)
@pytest.mark.parametrize("split", SPLITS[1:], ids=["pairs", "one-five", "five-one", "singles"])
def test_loss_and_gradient_do_not_depend_on_the_micro_batch_split(
    name: str, overrides: dict[str, Any], with_weights: bool, split: list[list[int]]
) -> None:
    whole_loss, whole_grad = loss_and_grad(name, overrides, SPLITS[0], with_weights)
    split_loss, split_grad = loss_and_grad(name, overrides, split, with_weights)
    assert whole_grad.abs().sum() > 0
    assert_close(split_loss, whole_loss, atol=1e-6, rtol=1e-6)
    assert_close(split_grad, whole_grad, atol=1e-6, rtol=1e-6)


def test_the_whole_batch_with_default_counts_equals_the_whole_batch_with_global_counts() -> None:
    batch = step_batch()
    params = make_loss_params("grpo_ds")
    local, _ = compute_policy_loss(
        "grpo_ds",
        PolicyLossInputs(
            logprob=batch["logprob"],
            old_logprob=batch["old_logprob"],
            advantages=batch["advantages"],
            response_mask=batch["response_mask"],
        ),
        params,
    )
    global_counts, _ = loss_and_grad("grpo_ds", {}, SPLITS[0])
    assert_close(local, global_counts, atol=1e-6, rtol=1e-6)


def test_micro_batch_scoped_stare_selection_does_depend_on_the_split() -> None:
    """The official code selects L⁺ per micro-batch (ALGORITHMS §5.3): splitting changes |L⁺|, which is
    why the step-batch scope passes precomputed weights."""
    whole, _ = loss_and_grad("stare", {"top_ratio": 0.2}, SPLITS[0])
    singles, _ = loss_and_grad("stare", {"top_ratio": 0.2}, SPLITS[-1])
    assert not torch.allclose(whole, singles, atol=1e-6, rtol=1e-6)
