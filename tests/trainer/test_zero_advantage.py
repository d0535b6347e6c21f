"""Rows with advantage exactly 0 get exactly 0 gradient from the losses that say so
(`zero_advantage_rows_inert`), which is what lets the engine score them without autograd."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from contract.algorithms import ALGORITHMS
from contract.control.split import SplitState
from trainer.algos import POLICY_LOSSES, PolicyLossInputs, compute_policy_loss, make_loss_params
from trainer.algos.losses import zero_advantage_rows_inert

# The losses registered with inert zero-advantage rows (contract.algorithms).
ZERO_ADVANTAGE_NO_GRADIENT = frozenset(name for name, a in ALGORITHMS.items() if a.zero_advantage_inert)

B, T = 6, 9
ZERO_ROWS = [1, 4]

# Parameters that put every branch of each loss to work on a small batch: dual clip, STARE's gate on
# with both variants, RSI's kept-token denominator, selections wide enough to pick tokens of every row.
PARAMS: dict[str, list[dict[str, Any]]] = {
    "grpo": [{}],
    "grpo_ds": [{}, {"agg_mode": "seq-mean-token-mean"}],
    "dapo": [{}],
    "dr_grpo": [{}],
    "stare": [
        # the gate on: its initial state, which the loss takes without a control argument
        {"top_ratio": 0.5, "reweight_w": 1.5, "reweight_m": 0.5, "variant": "O1"},
        {"top_ratio": 0.5, "reweight_w": 1.5, "reweight_m": 0.5, "variant": "C2"},
    ],
    "rsi_s": [{}, {"denominator": "kept"}, {"bound_mode": "quantile", "r_lo": 0.2, "r_hi": 0.8}],
    "forking_8020": [{"top_entropy_ratio": 0.5}],
    "clip_cov": [{"clip_cov_ratio": 0.5, "cov_lower": -10.0, "cov_upper": 10.0}],
    # the PI laws' STARE and clip-higher actuators at their initial state (no control argument)
    "stare_pi": [{}, {"variant": "C2"}],
    "clip_pi": [{}],
    # entropy_split at rest, raising (the bonus reaches Â ≠ 0 rows only) and lowering (κ on confident tokens)
    "entropy_split": [{}, {"_control": {"bonus": 0.3}}, {"_control": {"sharpen": 0.5}, "p_conf": 0.2}],
}


def batch(seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    logprob = -torch.rand(B, T, generator=gen) * 4
    # Off-policy: the ratios spread over both clip edges and the dual-clip cap.
    old = logprob + torch.randn(B, T, generator=gen) * 0.6
    advantages = torch.randn(B, generator=gen)
    advantages[ZERO_ROWS] = 0.0
    mask = (torch.rand(B, T, generator=gen) > 0.2).float()
    mask[:, 0] = 1.0
    return {
        "logprob": logprob,
        "old": old,
        "advantages": advantages,
        "mask": mask,
        "entropy": torch.rand(B, T, generator=gen) * 3,
        "generator": torch.Generator().manual_seed(seed + 1),
    }


def gradient(
    name: str, overrides: dict[str, Any], data: dict[str, Any], ref_logprob: torch.Tensor | None = None
) -> torch.Tensor:
    overrides = dict(overrides)
    control = overrides.pop("_control", None)
    leaf = data["logprob"].clone().requires_grad_(True)
    entropy = data["entropy"].clone().requires_grad_(control is not None)
    inputs = PolicyLossInputs(
        logprob=leaf,
        old_logprob=data["old"],
        advantages=data["advantages"],
        response_mask=data["mask"],
        entropy=entropy,
        ref_logprob=ref_logprob,
        global_token_count=float(data["mask"].sum()) * 2,  # the batch is half of a larger step
        global_sequence_count=2.0 * B,
        max_response_length=T,
        generator=data["generator"],
    )
    state = None if control is None else SplitState(**control)
    loss, _ = compute_policy_loss(name, inputs, make_loss_params(name, **overrides), control=state)
    loss.backward()
    assert leaf.grad is not None
    if entropy.grad is None:
        return leaf.grad
    return torch.cat([leaf.grad, entropy.grad], dim=1)  # the bonus's gradient reaches the model through H_t


def test_the_set_covers_every_loss_but_kl_cov_and_the_entropy_bonus() -> None:
    # adaptive_entropy's −α·H and entropy_pi's ±α·H reach every row (tests/trainer/test_adaptive_entropy.py,
    # tests/trainer/test_pi_laws.py).
    bonus = {"kl_cov", "adaptive_entropy", "entropy_pi"}
    assert set(POLICY_LOSSES.names()) - ZERO_ADVANTAGE_NO_GRADIENT == bonus
    assert set(PARAMS) == ZERO_ADVANTAGE_NO_GRADIENT


@pytest.mark.parametrize("name", sorted(ZERO_ADVANTAGE_NO_GRADIENT))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_zero_advantage_rows_get_exactly_zero_gradient(name: str, seed: int) -> None:
    for overrides in PARAMS[name]:
        grad = gradient(name, overrides, batch(seed))
        assert torch.equal(grad[ZERO_ROWS].abs(), torch.zeros(len(ZERO_ROWS), grad.shape[1])), (
            name,
            overrides,
        )
        others = [i for i in range(B) if i not in ZERO_ROWS]
        assert grad[others].abs().sum() > 0, (name, overrides)  # the loss does reach the other rows
        params = {k: v for k, v in overrides.items() if k != "_control"}
        assert zero_advantage_rows_inert(name, make_loss_params(name, **params))


def test_kl_cov_reaches_zero_advantage_rows_off_policy() -> None:
    # Its penalty |ℓ − ℓ_old| on the highest-covariance tokens is not a multiple of Â: with the batch's
    # mean advantage away from 0, tokens of Â = 0 rows are picked and penalised.
    data = batch(0)
    grad = gradient("kl_cov", {"kl_cov_ratio": 0.5, "kl_cov_coef": 1.0}, data)
    assert grad[ZERO_ROWS].abs().sum() > 0
    assert not zero_advantage_rows_inert("kl_cov", make_loss_params("kl_cov"))


@pytest.mark.parametrize("name", ["grpo", "stare", "rsi_s"])
def test_a_kl_penalty_makes_no_row_inert(name: str) -> None:
    assert not zero_advantage_rows_inert(name, make_loss_params(name, kl_beta=0.1))
    data = batch(3)
    grad = gradient(name, {"kl_beta": 0.1}, data, ref_logprob=data["old"] - 0.3)
    assert grad[ZERO_ROWS].abs().sum() > 0


def test_unknown_loss_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="nope"):
        zero_advantage_rows_inert("nope", make_loss_params("grpo"))
