"""ALGORITHMS.md §5 and §7.7–7.11: STARE's selection, weights, gate and adaptive schedule."""

from __future__ import annotations

import dataclasses
import itertools
import math
from fractions import Fraction
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from trainer.algos import (
    PolicyLossInputs,
    StareControllerState,
    StareGateSettings,
    StareParams,
    compute_policy_loss,
    initial_state,
    stare_weights,
    update,
)
from trainer.algos.selection import ceil_count
from trainer.algos.stare import stare_selection

# ------------------------------------------------------------------------------------ fact 7


def scope_with(n_pos: int, n_neg: int, n_zero: int, n_pad: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A flat (1, n) scope: n_pos tokens with Â > 0, n_neg with Â < 0, n_zero with Â = 0, n_pad padding,
    shuffled; distinct surprisals, and the largest ones put on padding and Â = 0 tokens as decoys."""
    n = n_pos + n_neg + n_zero + n_pad
    gen = torch.Generator().manual_seed(seed)
    adv = torch.cat([torch.full((n_pos,), 0.7), torch.full((n_neg,), -0.4), torch.zeros(n_zero + n_pad)])
    mask = torch.cat([torch.ones(n_pos + n_neg + n_zero), torch.zeros(n_pad)])
    surprisal = torch.randperm(n, generator=gen).float() * 0.1 + 0.05
    decoys = torch.arange(n_pos + n_neg, n)
    surprisal[decoys] = 100.0 + torch.arange(decoys.numel()).float()
    order = torch.randperm(n, generator=gen)
    return {
        "surprisal": surprisal[order].view(1, n),
        "advantages": adv[order].view(1, n),
        "response_mask": mask[order].view(1, n),
    }


def expected_count(ratio: float, n: int) -> int:
    """max(1, ⌈P·n⌉) for n > 0, computed in exact rational arithmetic."""
    if n == 0:
        return 0
    return max(1, math.ceil(Fraction(str(ratio)) * n))


COUNT_CASES = [
    (0.1, 1),
    (0.1, 9),
    (0.1, 10),
    (0.1, 11),
    (0.28, 25),  # 0.28·25 = 7.000000000000001 in floating point; the count is 7
    (0.3, 10),  # 0.3·10 = 3.0000000000000004
    (0.07, 100),  # 7.000000000000001
    (0.5, 7),
    (1.0, 13),
    (0.1, 0),
    (1e-9, 5),  # P·n below the official code's 1e-6 guard: still max(1, ·)
]


@pytest.mark.parametrize(("ratio", "n_pos"), COUNT_CASES)
def test_positive_selection_count_is_max_one_ceil_p_times_candidates(ratio: float, n_pos: int) -> None:
    scope = scope_with(n_pos=n_pos, n_neg=6, n_zero=3, n_pad=4, seed=n_pos)
    chosen_pos, chosen_neg, pos, neg = stare_selection(
        scope["surprisal"], scope["advantages"], scope["response_mask"], top_ratio=ratio, negative=False
    )
    assert int(pos.sum()) == n_pos and int(neg.sum()) == 6
    assert int(chosen_pos.sum()) == expected_count(ratio, n_pos)
    assert not chosen_neg.any()  # O1: L⁻ is empty


# 0.28·25, 0.3·10 and 0.07·100 overshoot the integer in floating point; a plain ceil would add one.
@pytest.mark.parametrize(("ratio", "n", "count"), [(0.28, 25, 7), (0.3, 10, 3), (0.07, 100, 7), (0.1, 11, 2)])
def test_the_count_is_not_fooled_by_floating_point_error(ratio: float, n: int, count: int) -> None:
    assert int(ceil_count(torch.tensor(n), ratio)) == count
    assert int(ceil_count(torch.tensor(0), ratio)) == 0


@pytest.mark.parametrize(("ratio", "n_neg"), COUNT_CASES)
def test_negative_selection_count_in_c2(ratio: float, n_neg: int) -> None:
    scope = scope_with(n_pos=5, n_neg=n_neg, n_zero=2, n_pad=3, seed=n_neg + 50)
    _, chosen_neg, _, neg = stare_selection(
        scope["surprisal"], scope["advantages"], scope["response_mask"], top_ratio=ratio, negative=True
    )
    assert int(neg.sum()) == n_neg
    assert int(chosen_neg.sum()) == expected_count(ratio, n_neg)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("ratio", [0.1, 0.3, 0.6])
def test_selected_tokens_are_the_highest_surprisal_positive_ones(seed: int, ratio: float) -> None:
    scope = scope_with(n_pos=17, n_neg=11, n_zero=5, n_pad=6, seed=seed)
    chosen_pos, chosen_neg, pos, neg = stare_selection(
        scope["surprisal"], scope["advantages"], scope["response_mask"], top_ratio=ratio, negative=True
    )
    s = scope["surprisal"]
    for chosen, candidates in ((chosen_pos, pos), (chosen_neg, neg)):
        assert not (chosen & ~candidates).any()  # padding, prompt, Â = 0 and wrong-sign tokens never
        assert s[chosen].min() > s[candidates & ~chosen].max()
    assert (scope["advantages"][chosen_pos] > 0).all()
    assert (scope["response_mask"][chosen_pos | chosen_neg] == 1).all()


def test_selection_pools_tokens_across_the_rows_of_the_scope() -> None:
    # Two responses with 5 positive tokens each: ⌈0.1·10⌉ = 1 token for the scope, not one per row.
    surprisal = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5], [0.6, 2.0, 0.7, 0.8, 0.9]])
    chosen_pos, _, _, _ = stare_selection(
        surprisal, torch.tensor([1.0, 2.0]), torch.ones(2, 5), top_ratio=0.1, negative=False
    )
    assert chosen_pos.nonzero().tolist() == [[1, 1]]


def test_an_empty_candidate_set_or_p_zero_selects_nothing() -> None:
    scope = scope_with(n_pos=0, n_neg=0, n_zero=4, n_pad=2)
    chosen_pos, chosen_neg, _, _ = stare_selection(
        scope["surprisal"], scope["advantages"], scope["response_mask"], top_ratio=0.1, negative=True
    )
    assert not chosen_pos.any() and not chosen_neg.any()
    scope = scope_with(n_pos=10, n_neg=10, n_zero=0, n_pad=0)
    chosen_pos, chosen_neg, _, _ = stare_selection(
        scope["surprisal"], scope["advantages"], scope["response_mask"], top_ratio=0.0, negative=True
    )
    assert not chosen_pos.any() and not chosen_neg.any()


def test_the_loss_selects_from_the_current_pass_surprisal_over_its_micro_batch() -> None:
    # Padding holds the most surprising tokens; Â = 0 row too. Only (0, 2) may be up-weighted.
    logprob = torch.tensor([[-0.1, -0.3, -2.0, -9.0], [-8.0, -7.0, -0.2, -0.1], [-1.0, -1.5, -0.5, -9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]])
    batch = PolicyLossInputs(
        logprob=logprob,
        old_logprob=logprob.clone(),
        advantages=torch.tensor([1.0, 0.0, -1.0]),
        response_mask=mask,
    )
    _, metrics = compute_policy_loss("stare", batch, top_ratio=0.2)
    weights, _ = stare_weights(
        -logprob, batch.advantages, mask, top_ratio=0.2, reweight_w=1.1, reweight_m=0.9, variant="O1",
        gate_on=True,
    )  # fmt: skip
    expected = torch.ones(3, 4)
    expected[0, 2] = 1.1
    assert torch.equal(weights, expected)
    assert_close(metrics["stare/positive_reweight_ratio"], torch.tensor(1 / 10))


# ------------------------------------------------------------------------------------ fact 8


@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize(("ratio", "w", "m"), [(0.1, 1.1, 0.9), (0.28, 1.05, 0.95), (0.5, 1.5, 0.5)])
@pytest.mark.parametrize("seed", [0, 1])
def test_mean_weight_is_one_plus_w_minus_one_times_the_selected_share(
    variant: str, ratio: float, w: float, m: float, seed: int
) -> None:
    scope = scope_with(n_pos=25, n_neg=14, n_zero=4, n_pad=7, seed=seed)
    weights, metrics = stare_weights(
        scope["surprisal"], scope["advantages"], scope["response_mask"],
        top_ratio=ratio, reweight_w=w, reweight_m=m, variant=variant, gate_on=True,
    )  # fmt: skip
    n_active = 25 + 14 + 4
    n_up = expected_count(ratio, 25)
    n_down = expected_count(ratio, 14) if variant == "C2" else 0
    expected = 1 + (w - 1) * n_up / n_active + (m - 1) * n_down / n_active
    assert_close(metrics["stare/mean_weight"], torch.tensor(expected))
    assert int((weights == w).sum()) == n_up
    assert int((weights == m).sum()) == n_down
    assert_close(metrics["stare/positive_reweight_ratio"], torch.tensor(n_up / n_active))
    assert_close(metrics["stare/negative_reweight_ratio"], torch.tensor(n_down / n_active))
    assert_close(metrics["stare/positive_candidate_ratio"], torch.tensor(25 / n_active))
    assert_close(metrics["stare/negative_candidate_ratio"], torch.tensor(14 / n_active))


def test_weights_are_never_renormalised_and_are_one_when_the_gate_is_off() -> None:
    scope = scope_with(n_pos=10, n_neg=10, n_zero=0, n_pad=0)
    on, _ = stare_weights(
        scope["surprisal"], scope["advantages"], scope["response_mask"],
        top_ratio=0.1, reweight_w=1.1, reweight_m=0.9, variant="C2", gate_on=True,
    )  # fmt: skip
    off, off_metrics = stare_weights(
        scope["surprisal"], scope["advantages"], scope["response_mask"],
        top_ratio=0.1, reweight_w=1.1, reweight_m=0.9, variant="C2", gate_on=False,
    )  # fmt: skip
    assert sorted(on.view(-1).tolist()) == pytest.approx([0.9] + [1.0] * 18 + [1.1])
    assert torch.equal(off, torch.ones_like(off))
    assert off_metrics["stare/mean_weight"].item() == 1.0
    assert off_metrics["stare/positive_reweight_ratio"].item() == 0.0


# ------------------------------------------------------------------------------------ fact 9


def test_gate_is_on_iff_the_batch_entropy_is_strictly_below_target() -> None:
    params = StareGateSettings(target_entropy=0.3)
    state = initial_state(params, StareParams())
    assert state.gate_on  # no measurement yet
    assert update(state, 0.2999, params).gate_on
    assert not update(state, 0.3, params).gate_on  # off at equality
    assert not update(state, 0.3001, params).gate_on
    assert update(state, math.nextafter(0.3, 0.0), params).gate_on
    assert update(state, 0.0, params).gate_on


def test_the_gate_has_no_hysteresis() -> None:
    params = StareGateSettings(target_entropy=0.5)
    state = initial_state(params, StareParams())
    trajectory = [0.6, 0.49, 0.51, 0.5, 0.2, 0.9]
    gates = []
    for entropy in trajectory:
        state = update(state, entropy, params)
        gates.append(state.gate_on)
    assert gates == [False, True, False, False, True, False]
    assert state.updates == len(trajectory)
    assert state.batch_entropy == 0.9


@pytest.mark.parametrize("entropy", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("adaptive", [False, True])
def test_a_non_finite_batch_entropy_leaves_the_state_unchanged(entropy: float, adaptive: bool) -> None:
    params = StareGateSettings(adaptive=adaptive)
    state = update(initial_state(params, StareParams()), 0.9, params)  # gate off, W/M moved if adaptive
    assert update(state, entropy, params) == state


def test_controller_state_round_trips_through_a_dict() -> None:
    params = StareGateSettings(adaptive=True)
    state = update(update(initial_state(params, StareParams()), 0.1, params), 0.2, params)
    assert StareControllerState.from_dict(state.to_dict()) == state


def bit_identity_batch(dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    old = -torch.rand(4, 9, generator=gen) * 4.0 - 0.01
    log_ratio = torch.randn(4, 9, generator=gen) * 0.5
    log_ratio[1, 0] = 3.0  # dual clip on a negative row
    return {
        "logprob": (old + log_ratio).to(dtype),
        "old_logprob": old,
        "advantages": torch.tensor([[1.2], [-0.7], [0.4], [-2.0]]).expand(4, 9).clone(),
        "response_mask": (torch.arange(9).unsqueeze(0) < torch.tensor([[9], [6], [2], [8]])).float(),
    }


def loss_and_grad(name: str, batch: dict[str, torch.Tensor], **overrides: Any) -> tuple[torch.Tensor, ...]:
    logprob = batch["logprob"].clone().requires_grad_(True)
    inputs = PolicyLossInputs(**{**batch, "logprob": logprob})
    loss, _ = compute_policy_loss(name, inputs, **overrides)
    (grad,) = torch.autograd.grad(loss, logprob)
    return loss, grad


@pytest.mark.parametrize(
    "overrides",
    [
        {"control": StareControllerState(gate_on=False, reweight_w=1.1, reweight_m=0.9)},
        {"variant": "C2", "control": StareControllerState(gate_on=False, reweight_w=1.5, reweight_m=0.5)},
        {"reweight_w": 1.0},
        {"reweight_w": 1.0, "reweight_m": 1.0, "variant": "C2"},
        {"top_ratio": 0.0},
        {"top_ratio": 0.0, "variant": "C2"},
    ],
    ids=["gate-off", "gate-off-c2", "w1", "w1-m1-c2", "p0", "p0-c2"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_neutral_stare_is_bit_identical_to_grpo_ds(overrides: dict[str, Any], dtype: torch.dtype) -> None:
    batch = bit_identity_batch(dtype)
    stare_loss, stare_grad = loss_and_grad("stare", batch, **overrides)
    baseline_loss, baseline_grad = loss_and_grad("grpo_ds", batch)
    assert torch.equal(stare_loss, baseline_loss)
    assert torch.equal(stare_grad, baseline_grad)


def test_active_stare_differs_from_grpo_ds() -> None:
    batch = bit_identity_batch()
    stare_loss, _ = loss_and_grad("stare", batch)
    baseline_loss, _ = loss_and_grad("grpo_ds", batch)
    assert not torch.equal(stare_loss, baseline_loss)


def test_gate_state_drives_the_loss_as_its_control_argument() -> None:
    gate = StareGateSettings(target_entropy=0.3)
    batch = bit_identity_batch()
    for entropy, expect_neutral in ((0.31, True), (0.3, True), (0.29, False)):
        state = update(initial_state(gate, StareParams()), entropy, gate)
        stare_loss, _ = loss_and_grad("stare", batch, control=state)
        baseline_loss, _ = loss_and_grad("grpo_ds", batch)
        assert torch.equal(stare_loss, baseline_loss) == expect_neutral


# ------------------------------------------------------------------------------------ fact 10


@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize("ratio", [0.1, 0.5])
def test_stare_gradient_is_omega_times_the_grpo_ds_gradient(variant: str, ratio: float) -> None:
    batch = bit_identity_batch()
    _, stare_grad = loss_and_grad("stare", batch, variant=variant, top_ratio=ratio, reweight_w=1.3)
    _, baseline_grad = loss_and_grad("grpo_ds", batch)
    omega, _ = stare_weights(
        -batch["logprob"], batch["advantages"], batch["response_mask"],
        top_ratio=ratio, reweight_w=1.3, reweight_m=0.9, variant=variant, gate_on=True,
    )  # fmt: skip
    assert (omega != 1).any()
    reweighted = (omega != 1) & (baseline_grad != 0)
    assert reweighted.any()  # the check below is not vacuous
    assert_close(stare_grad, omega * baseline_grad, atol=1e-7, rtol=1e-6)


# ------------------------------------------------------------------------------------ fact 11


def test_adaptive_schedule_below_target_saturates_at_w_max_and_m_min() -> None:
    params = StareGateSettings(adaptive=True, alpha=0.01)
    state = initial_state(params, StareParams(reweight_w=1.1, reweight_m=0.9))
    history = []
    for _ in range(100):
        state = update(state, 0.1, params)  # below the 0.3 target
        history.append((state.reweight_w, state.reweight_m))
    assert state.reweight_w == 1.5 and state.reweight_m == 0.5
    assert history[0] == pytest.approx((1.11, 0.89), abs=1e-12)
    for (w0, m0), (w1, m1) in itertools.pairwise(history):
        assert w1 == pytest.approx(min(w0 + 0.01, 1.5), abs=1e-12)
        assert m1 == pytest.approx(max(m0 - 0.01, 0.5), abs=1e-12)
    # (1.5 − 1.1) / α = 40 updates to reach both bounds, exactly, and not one earlier
    assert history.index((1.5, 0.5)) == 39
    assert all(w < 1.5 and m > 0.5 for w, m in history[:39])


def test_adaptive_schedule_above_target_lowers_w_by_alpha_per_step_to_one() -> None:
    params = StareGateSettings(adaptive=True, alpha=0.01)
    state = initial_state(params, StareParams(reweight_w=1.5, reweight_m=0.5))
    ws = [state.reweight_w]
    for _ in range(60):
        state = update(state, 0.8, params)
        ws.append(state.reweight_w)
    for step, w in enumerate(ws):
        assert w == pytest.approx(max(1.5 - 0.01 * step, 1.0), abs=1e-9)
    assert ws[-1] == 1.0 and state.reweight_m == 1.0
    assert not state.gate_on


def test_adaptive_schedule_holds_at_the_target_and_is_off_by_default() -> None:
    adaptive = StareGateSettings(adaptive=True)
    held = update(initial_state(adaptive, StareParams()), 0.3, adaptive)
    assert (held.reweight_w, held.reweight_m) == (1.1, 0.9)
    fixed = StareGateSettings()
    moved = initial_state(fixed, StareParams())
    for _ in range(10):
        moved = update(moved, 0.05, fixed)
    assert (moved.reweight_w, moved.reweight_m) == (1.1, 0.9)


def test_controller_state_is_frozen() -> None:
    state = initial_state(StareGateSettings(), StareParams())
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.gate_on = False  # type: ignore[misc]
