"""ALGORITHMS.md §4–6: every registered policy loss on a 2 × 3 case computed by hand (plain arithmetic).

The case: Â = (+1, −0.5); response 2 has one padding position. Ratios ρ = exp(ℓ − ℓ_old):
    response 1 (Â = +1):   ρ = 1, 1.5, 0.5      → unclipped, clipped high, unclipped (ρ < 1 with Â > 0)
    response 2 (Â = −0.5): ρ = 0.5, 12, (3 pad) → clipped low, dual clip (c = 10) active
so each clipping branch is exercised once.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from contract.hyperparams import ClipCovParams, ForkingParams, KlCovParams, RsiParams
from trainer.algos import POLICY_LOSSES, PolicyLossInputs, StareParams, compute_policy_loss, make_loss_params

OLD = [[-1.0, -2.0, -0.5], [-1.5, -3.0, -0.7]]
RATIO = [[1.0, 1.5, 0.5], [0.5, 12.0, 3.0]]
LOGPROB = [[o + math.log(r) for o, r in zip(orow, rrow)] for orow, rrow in zip(OLD, RATIO)]
ADV = [1.0, -0.5]
MASK = [[1, 1, 1], [1, 1, 0]]
ACTIVE = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
N = 5
# Entropies: RSI = s/H = 2.5, 1.59, 0.40 | 1.10, 1.03 (pad: 9.0 is the largest entropy, never used).
ENTROPY = [[0.4, 1.0, 3.0], [2.0, 0.5, 9.0]]
# Reference policy offsets d = ℓ_ref − ℓ for the KL penalty.
REF_OFFSET = [[0.1, -0.2, 0.0], [0.3, -0.1, 5.0]]
TOL = {"atol": 1e-6, "rtol": 1e-5}


def inputs(**overrides: Any) -> PolicyLossInputs:
    fields: dict[str, Any] = {
        "logprob": torch.tensor(LOGPROB, dtype=torch.float64).float().requires_grad_(True),
        "old_logprob": torch.tensor(OLD),
        "advantages": torch.tensor(ADV),
        "response_mask": torch.tensor(MASK),
        "entropy": torch.tensor(ENTROPY),
        "ref_logprob": torch.tensor(LOGPROB, dtype=torch.float64).float() + torch.tensor(REF_OFFSET),
    }
    fields.update(overrides)
    return PolicyLossInputs(**fields)


def clip_loss(rho: float, adv: float, low: float, high: float, dual: float | None) -> float:
    """One token of the clipped surrogate, the textbook way."""
    loss = max(-adv * rho, -adv * min(max(rho, 1 - low), 1 + high))
    if dual is not None and adv < 0:
        loss = min(loss, -dual * adv)
    return loss


def per_token(low: float, high: float, dual: float | None) -> dict[tuple[int, int], float]:
    return {(i, j): clip_loss(RATIO[i][j], ADV[i], low, high, dual) for i, j in ACTIVE}


def k3(d: float) -> float:
    return math.exp(d) - d - 1.0


def test_the_registry_holds_every_documented_loss() -> None:
    assert POLICY_LOSSES.names() == sorted(
        [
            "grpo",
            "grpo_ds",
            "dapo",
            "dr_grpo",
            "stare",
            "rsi_s",
            "forking_8020",
            "clip_cov",
            "kl_cov",
            "adaptive_entropy",
            "entropy_pi",
            "stare_pi",
            "clip_pi",
            "entropy_split",
        ]
    )


def test_the_textbook_per_token_values_of_the_case() -> None:
    """Pins the hand arithmetic the other tests build on (ε 0.2/0.28, c = 10)."""
    values = per_token(0.2, 0.28, 10.0)
    assert values == pytest.approx(
        {(0, 0): -1.0, (0, 1): -1.28, (0, 2): -0.5, (1, 0): 0.4, (1, 1): 5.0}, abs=1e-12
    )


# ------------------------------------------------------------------------------------ clip losses


@pytest.mark.parametrize("name", ["grpo_ds", "dapo"])
def test_grpo_ds_and_dapo_token_mean_with_dual_clip(name: str) -> None:
    loss, metrics = compute_policy_loss(name, inputs())
    expected = (-1.0 - 1.28 - 0.5 + 0.4 + 5.0) / N  # 0.524
    assert_close(loss, torch.tensor(expected), **TOL)
    assert_close(metrics["loss/policy"], torch.tensor(expected), **TOL)
    assert_close(metrics["clip/low_fraction"], torch.tensor(1 / N), **TOL)
    assert_close(metrics["clip/high_fraction"], torch.tensor(1 / N), **TOL)
    assert_close(metrics["clip/fraction"], torch.tensor(2 / N), **TOL)
    assert_close(metrics["clip/dual_fraction"], torch.tensor(1 / N), **TOL)
    approx_kl = -sum(math.log(RATIO[i][j]) for i, j in ACTIVE) / N
    assert_close(metrics["kl/approx_old"], torch.tensor(approx_kl), **TOL)
    assert metrics["tokens/active"].item() == N


def test_grpo_ds_gradient_is_zero_on_clipped_and_padding_tokens() -> None:
    batch = inputs()
    loss, _ = compute_policy_loss("grpo_ds", batch)
    (grad,) = torch.autograd.grad(loss, batch.logprob)
    # Unclipped tokens: ∂(−Âρ)/∂ℓ = −Âρ; clipped high, clipped low, dual-clipped and padding: 0.
    expected = torch.tensor([[-1.0 / N, 0.0, -0.5 / N], [0.0, 0.0, 0.0]])
    assert_close(grad, expected, **TOL)


def test_without_the_dual_clip_the_large_ratio_is_not_capped() -> None:
    loss, metrics = compute_policy_loss("grpo_ds", inputs(), dual_clip_c=None)
    assert_close(loss, torch.tensor((-1.0 - 1.28 - 0.5 + 0.4 + 6.0) / N), **TOL)
    assert metrics["clip/dual_fraction"].item() == 0.0


def test_a_smaller_dual_clip_caps_more() -> None:
    loss, metrics = compute_policy_loss("grpo_ds", inputs(), dual_clip_c=1.1)
    # Â = −0.5: the cap −cÂ = 0.55 binds on ρ = 12 (6 → 0.55) but not on the low-clipped 0.4.
    assert_close(loss, torch.tensor((-1.0 - 1.28 - 0.5 + 0.4 + 0.55) / N), **TOL)
    assert_close(metrics["clip/dual_fraction"], torch.tensor(1 / N), **TOL)


def test_grpo_seq_mean_token_mean_with_symmetric_clip() -> None:
    loss, metrics = compute_policy_loss("grpo", inputs())
    values = per_token(0.2, 0.2, None)
    assert values[(0, 1)] == pytest.approx(-1.2) and values[(1, 1)] == pytest.approx(6.0)
    row0 = (values[(0, 0)] + values[(0, 1)] + values[(0, 2)]) / 3  # −0.9
    row1 = (values[(1, 0)] + values[(1, 1)]) / 2  # 3.2
    assert_close(loss, torch.tensor((row0 + row1) / 2), **TOL)
    assert_close(metrics["clip/high_fraction"], torch.tensor(1 / N), **TOL)
    assert metrics["clip/dual_fraction"].item() == 0.0
    assert "kl/ref_k3" not in metrics


def test_grpo_with_the_k3_penalty_to_the_reference_policy() -> None:
    loss, metrics = compute_policy_loss("grpo", inputs(), kl_beta=0.1)
    values = per_token(0.2, 0.2, None)
    penalised = {key: v + 0.1 * k3(REF_OFFSET[key[0]][key[1]]) for key, v in values.items()}
    row0 = sum(penalised[(0, j)] for j in range(3)) / 3
    row1 = sum(penalised[(1, j)] for j in range(2)) / 2
    assert_close(loss, torch.tensor((row0 + row1) / 2), **TOL)
    mean_k3 = sum(k3(REF_OFFSET[i][j]) for i, j in ACTIVE) / N
    assert_close(metrics["kl/ref_k3"], torch.tensor(mean_k3), **TOL)


def test_the_k3_penalty_gradient_on_a_token_mean_loss() -> None:
    batch = inputs()
    plain, _ = compute_policy_loss("grpo_ds", batch)
    (plain_grad,) = torch.autograd.grad(plain, batch.logprob)
    penalised, _ = compute_policy_loss("grpo_ds", batch, kl_beta=0.5)
    (grad,) = torch.autograd.grad(penalised, batch.logprob)
    expected_loss = plain.item() + 0.5 * sum(k3(REF_OFFSET[i][j]) for i, j in ACTIVE) / N
    assert_close(penalised, torch.tensor(expected_loss), **TOL)
    # d k3 / dℓ = 1 − e^(ℓ_ref − ℓ)
    kl_grad = torch.tensor(
        [[0.5 * (1 - math.exp(REF_OFFSET[i][j])) / N * MASK[i][j] for j in range(3)] for i in range(2)]
    )
    assert_close(grad - plain_grad, kl_grad, **TOL)


@pytest.mark.parametrize(
    ("overrides", "denominator"),
    [({}, 2 * 3), ({"global_sequence_count": 2.0, "max_response_length": 4}, 2 * 4)],
)
def test_dr_grpo_sums_and_divides_by_responses_times_budget(
    overrides: dict[str, Any], denominator: int
) -> None:
    loss, _ = compute_policy_loss("dr_grpo", inputs(**overrides))
    total = sum(per_token(0.2, 0.2, None).values())  # 3.7
    assert_close(loss, torch.tensor(total / denominator), **TOL)


# ------------------------------------------------------------------------------------ STARE


def test_stare_o1_up_weights_the_highest_surprisal_positive_token() -> None:
    loss, metrics = compute_policy_loss("stare", inputs())
    # T⁺ = response 1 (3 tokens); ⌈0.1·3⌉ = 1; surprisals 1.0, 1.59, 1.19 → position (0, 1) gets W = 1.1.
    values = per_token(0.2, 0.28, 10.0)
    values[(0, 1)] *= 1.1
    assert_close(loss, torch.tensor(sum(values.values()) / N), **TOL)  # 0.4984
    assert_close(metrics["stare/mean_weight"], torch.tensor((4 + 1.1) / N), **TOL)
    assert_close(metrics["stare/positive_candidate_ratio"], torch.tensor(3 / N), **TOL)
    assert_close(metrics["stare/negative_candidate_ratio"], torch.tensor(2 / N), **TOL)
    assert_close(metrics["stare/positive_reweight_ratio"], torch.tensor(1 / N), **TOL)
    assert metrics["stare/negative_reweight_ratio"].item() == 0.0
    assert metrics["stare/gate_on"].item() == 1.0
    assert_close(metrics["stare/reweight_w"], torch.tensor(1.1))


def test_stare_c2_also_down_weights_the_highest_surprisal_negative_token() -> None:
    loss, metrics = compute_policy_loss("stare", inputs(), variant="C2")
    # T⁻ = (1, 0), (1, 1) with surprisals 2.19, 0.52 → (1, 0) gets M = 0.9.
    values = per_token(0.2, 0.28, 10.0)
    values[(0, 1)] *= 1.1
    values[(1, 0)] *= 0.9
    assert_close(loss, torch.tensor(sum(values.values()) / N), **TOL)  # 0.4904
    assert_close(metrics["stare/mean_weight"], torch.tensor((3 + 1.1 + 0.9) / N), **TOL)
    assert_close(metrics["stare/negative_reweight_ratio"], torch.tensor(1 / N), **TOL)


def test_stare_with_precomputed_step_batch_weights_uses_them() -> None:
    weights = torch.tensor([[2.0, 1.0, 1.0], [1.0, 0.5, 7.0]])
    loss, _ = compute_policy_loss("stare", inputs(token_weights=weights), scope="step_batch")
    values = per_token(0.2, 0.28, 10.0)
    values[(0, 0)] *= 2.0
    values[(1, 1)] *= 0.5
    assert_close(loss, torch.tensor(sum(values.values()) / N), **TOL)


# ------------------------------------------------------------------------------------ RSI-S


def rsi(i: int, j: int) -> float:
    return -LOGPROB[i][j] / ENTROPY[i][j]


def test_rsi_values_of_the_case() -> None:
    values = {key: rsi(*key) for key in ACTIVE}
    assert values == pytest.approx(
        {(0, 0): 2.5, (0, 1): 1.5945, (0, 2): 0.3977, (1, 0): 1.0966, (1, 1): 1.0302}, abs=1e-4
    )


@pytest.mark.parametrize(("denominator", "divisor"), [("all", N), ("kept", 3)])
def test_rsi_s_fixed_bounds_keep_half_to_twice_the_entropy(denominator: str, divisor: int) -> None:
    loss, metrics = compute_policy_loss("rsi_s", inputs(), denominator=denominator)
    values = per_token(0.2, 0.28, 10.0)
    kept = [(0, 1), (1, 0), (1, 1)]  # RSI 1.59, 1.10, 1.03; 2.5 is above 2, 0.40 below 0.5
    assert_close(loss, torch.tensor(sum(values[k] for k in kept) / divisor), **TOL)
    assert_close(metrics["rsi/kept_ratio"], torch.tensor(3 / N), **TOL)
    assert_close(metrics["rsi/dropped_low_fraction"], torch.tensor(1 / N), **TOL)
    assert_close(metrics["rsi/dropped_high_fraction"], torch.tensor(1 / N), **TOL)
    values_rsi = [rsi(*key) for key in ACTIVE]
    mean = sum(values_rsi) / N
    std = math.sqrt(sum((v - mean) ** 2 for v in values_rsi) / N)
    assert_close(metrics["rsi/mean"], torch.tensor(mean), **TOL)
    assert_close(metrics["rsi/std"], torch.tensor(std), **TOL)


def test_rsi_s_quantile_bounds_use_the_scope_quantiles() -> None:
    loss, _ = compute_policy_loss("rsi_s", inputs(), bound_mode="quantile", r_lo=0.1, r_hi=0.6)
    ordered = sorted(rsi(*key) for key in ACTIVE)  # 0.40, 1.03, 1.10, 1.59, 2.5
    lo = ordered[0] + 0.4 * (ordered[1] - ordered[0])  # linear interpolation at rank 0.1·4 = 0.4
    hi = ordered[2] + 0.4 * (ordered[3] - ordered[2])  # rank 0.6·4 = 2.4
    kept = [key for key in ACTIVE if lo <= rsi(*key) <= hi]
    assert kept == [(1, 0), (1, 1)]
    values = per_token(0.2, 0.28, 10.0)
    assert_close(loss, torch.tensor(sum(values[k] for k in kept) / N), **TOL)


def test_rsi_s_gradient_is_zero_on_dropped_tokens() -> None:
    batch = inputs(old_logprob=torch.tensor(LOGPROB, dtype=torch.float64).float())  # ρ = 1: nothing clipped
    loss, _ = compute_policy_loss("rsi_s", batch)
    (grad,) = torch.autograd.grad(loss, batch.logprob)
    # Kept: (0, 1), (1, 0), (1, 1); gradient −Â/N there.
    expected = torch.tensor([[0.0, -1.0 / N, 0.0], [0.5 / N, 0.5 / N, 0.0]])
    assert_close(grad, expected, **TOL)


@pytest.mark.parametrize("denominator", ["all", "kept"])
def test_rsi_s_adds_the_k3_penalty_in_both_denominator_modes(denominator: str) -> None:
    plain, _ = compute_policy_loss("rsi_s", inputs(), denominator=denominator)
    penalised, metrics = compute_policy_loss("rsi_s", inputs(), denominator=denominator, kl_beta=0.2)
    mean_k3 = sum(k3(REF_OFFSET[i][j]) for i, j in ACTIVE) / N
    assert_close(penalised - plain, torch.tensor(0.2 * mean_k3), **TOL)
    assert_close(metrics["kl/ref_k3"], torch.tensor(mean_k3), **TOL)


# ------------------------------------------------------------------------------------ 80/20


def test_forking_8020_keeps_the_top_fifth_by_entropy_and_divides_by_all_tokens() -> None:
    loss, metrics = compute_policy_loss("forking_8020", inputs())
    # ⌈0.2·5⌉ = 1 token: the highest active entropy, 3.0 at (0, 2) (the padding's 9.0 does not count).
    values = per_token(0.2, 0.28, 10.0)
    assert_close(loss, torch.tensor(values[(0, 2)] / N), **TOL)
    assert_close(metrics["forking/kept_ratio"], torch.tensor(1 / N), **TOL)


def test_forking_8020_with_a_wider_ratio() -> None:
    loss, _ = compute_policy_loss("forking_8020", inputs(), top_entropy_ratio=0.5)
    # ⌈0.5·5⌉ = 3: entropies 3.0 (0, 2), 2.0 (1, 0), 1.0 (0, 1).
    values = per_token(0.2, 0.28, 10.0)
    assert_close(loss, torch.tensor((values[(0, 2)] + values[(1, 0)] + values[(0, 1)]) / N), **TOL)


# ------------------------------------------------------------------------------------ Clip-Cov


def test_clip_cov_zeroes_the_one_unclipped_token_in_the_covariance_window() -> None:
    # Â = ±2 (mean 0), ℓ − mean ℓ = (1.25, 1.25, −0.25 | −0.25, −2.75, 0.75), so
    # cov = (2.5, 2.5, −0.5 | 0.5, 5.5, −1.5): (0, 0) and (0, 1) lie in (1, 5), but (0, 1) is clipped.
    logprob = [[-0.5, -0.5, -2.0], [-2.0, -4.5, -1.0]]
    ratio = [[1.0, 1.5, 1.0], [1.0, 1.0, 0.5]]
    old = [[lp - math.log(r) for lp, r in zip(lrow, rrow)] for lrow, rrow in zip(logprob, ratio)]
    batch = PolicyLossInputs(
        logprob=torch.tensor(logprob).requires_grad_(True),
        old_logprob=torch.tensor(old),
        advantages=torch.tensor([2.0, -2.0]),
        response_mask=torch.ones(2, 3),
    )
    loss, metrics = compute_policy_loss("clip_cov", batch)
    # Per-token (ε 0.2/0.2): −2, −2.4, −2 | 2, 2, 1.6; the first is zeroed.
    assert_close(loss, torch.tensor((0.0 - 2.4 - 2.0 + 2.0 + 2.0 + 1.6) / 6), **TOL)
    assert_close(metrics["clip_cov/zeroed_fraction"], torch.tensor(1 / 6), **TOL)
    assert_close(metrics["clip_cov/window_fraction"], torch.tensor(1 / 6), **TOL)
    (grad,) = torch.autograd.grad(loss, batch.logprob)
    assert grad[0, 0].item() == 0.0
    assert_close(grad[0, 2], torch.tensor(-2.0 / 6), **TOL)


def test_clip_cov_with_an_empty_window_is_the_plain_clipped_loss() -> None:
    loss, metrics = compute_policy_loss("clip_cov", inputs())
    assert_close(loss, torch.tensor(sum(per_token(0.2, 0.2, None).values()) / N), **TOL)
    assert metrics["clip_cov/zeroed_fraction"].item() == 0.0


# ------------------------------------------------------------------------------------ KL-Cov


def test_kl_cov_penalises_the_top_covariance_token_and_is_unclipped() -> None:
    loss, metrics = compute_policy_loss("kl_cov", inputs())
    adv = {(i, j): ADV[i] for i, j in ACTIVE}
    lp = {(i, j): LOGPROB[i][j] for i, j in ACTIVE}
    mean_adv, mean_lp = sum(adv.values()) / N, sum(lp.values()) / N
    cov = {key: (adv[key] - mean_adv) * (lp[key] - mean_lp) for key in ACTIVE}
    top = max(cov, key=lambda key: cov[key])
    assert top == (1, 0)  # max(1, ⌊0.002·5⌋) = 1 token
    values = {key: -adv[key] * RATIO[key[0]][key[1]] for key in ACTIVE}  # no clipping at all
    values[top] += 1.0 * abs(math.log(RATIO[1][0]))
    assert_close(loss, torch.tensor(sum(values.values()) / N), **TOL)
    assert_close(metrics["kl_cov/penalised_fraction"], torch.tensor(1 / N), **TOL)


def test_kl_cov_coefficient_scales_the_penalty() -> None:
    base, _ = compute_policy_loss("kl_cov", inputs(), kl_cov_coef=0.0)
    penalised, _ = compute_policy_loss("kl_cov", inputs(), kl_cov_coef=3.0)
    assert_close(penalised - base, torch.tensor(3.0 * math.log(2.0) / N), **TOL)


# ------------------------------------------------------------------------------------ parameters


@pytest.mark.parametrize(
    ("name", "clip_high", "dual_clip_c", "agg_mode"),
    [
        ("grpo", 0.2, None, "seq-mean-token-mean"),
        ("grpo_ds", 0.28, 10.0, "token-mean"),
        ("dapo", 0.28, 10.0, "token-mean"),
        ("dr_grpo", 0.2, None, "seq-mean-token-sum-norm"),
        ("stare", 0.28, 10.0, "token-mean"),
        ("rsi_s", 0.28, 10.0, "token-mean"),
        ("forking_8020", 0.28, 10.0, "token-mean"),
        ("clip_cov", 0.2, None, "token-mean"),
        ("kl_cov", 0.2, None, "token-mean"),
    ],
)
def test_default_parameters_follow_the_spec(
    name: str, clip_high: float, dual_clip_c: float | None, agg_mode: str
) -> None:
    params = make_loss_params(name)
    assert (params.clip_low, params.clip_high, params.dual_clip_c, params.agg_mode, params.kl_beta) == (
        0.2,
        clip_high,
        dual_clip_c,
        agg_mode,
        0.0,
    )


def test_stare_rsi_and_baseline_specific_defaults() -> None:
    stare = make_loss_params("stare")
    assert isinstance(stare, StareParams)
    assert (
        stare.top_ratio,
        stare.reweight_w,
        stare.reweight_m,
        stare.variant,
        stare.scope,
    ) == (
        0.1,
        1.1,
        0.9,
        "O1",
        "micro_batch",
    )
    # The gate's state is the controller's, not a parameter (the gate is on before any measurement).
    assert "gate_on" not in {f.name for f in dataclasses.fields(stare)}
    assert compute_policy_loss("stare", inputs())[1]["stare/gate_on"].item() == 1.0
    rsi_params = make_loss_params("rsi_s")
    assert isinstance(rsi_params, RsiParams)
    assert (rsi_params.bound_mode, rsi_params.r_lo, rsi_params.r_hi, rsi_params.denominator) == (
        "fixed",
        0.5,
        2.0,
        "all",
    )
    forking = make_loss_params("forking_8020")
    assert isinstance(forking, ForkingParams) and forking.top_entropy_ratio == 0.2
    clip_cov = make_loss_params("clip_cov")
    assert isinstance(clip_cov, ClipCovParams)
    assert (clip_cov.clip_cov_ratio, clip_cov.cov_lower, clip_cov.cov_upper) == (2e-4, 1.0, 5.0)
    kl_cov = make_loss_params("kl_cov")
    assert isinstance(kl_cov, KlCovParams) and (kl_cov.kl_cov_ratio, kl_cov.kl_cov_coef) == (2e-3, 1.0)


def test_overrides_reach_the_loss() -> None:
    default, _ = compute_policy_loss("grpo_ds", inputs())
    wider, _ = compute_policy_loss("grpo_ds", inputs(), params=make_loss_params("grpo_ds", clip_high=1.0))
    # With ε_high = 1 the ratio 1.5 is no longer clipped: −1.28 becomes −1.5.
    assert_close(wider - default, torch.tensor((-1.5 + 1.28) / N), **TOL)
