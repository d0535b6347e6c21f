"""Bad arguments fail early with an error that names the argument (and, for names, lists the valid ones)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from trainer.algos import (
    POLICY_LOSSES,
    PolicyLossInputs,
    StareControllerState,
    StareGateSettings,
    StareParams,
    UnknownNameError,
    aggregate,
    compute_advantages,
    compute_policy_loss,
    make_loss_params,
    overlong_penalty,
    token_stats_from_logits,
    token_stats_reference,
)


def good_fields() -> dict[str, Any]:
    return {
        "logprob": torch.zeros(2, 3),
        "old_logprob": torch.zeros(2, 3),
        "advantages": torch.ones(2),
        "response_mask": torch.ones(2, 3),
    }


# ------------------------------------------------------------------------------------ names


def test_an_unknown_loss_name_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError) as caught:
        compute_policy_loss("ppo", PolicyLossInputs(**good_fields()))
    message = str(caught.value)
    assert "'ppo'" in message and "policy loss" in message
    for name in POLICY_LOSSES.names():
        assert name in message
    assert isinstance(caught.value, ValueError)


def test_make_loss_params_with_an_unknown_name_raises_the_registry_error() -> None:
    with pytest.raises(
        UnknownNameError,
        match=r"unknown policy loss 'stare_v2'; valid: adaptive_entropy, clip_cov, clip_pi, dapo",
    ):
        make_loss_params("stare_v2")


def test_an_unknown_advantage_estimator_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError, match=r"unknown advantage estimator 'gae'; valid: dr_grpo, grpo"):
        compute_advantages("gae", torch.ones(2), torch.zeros(2, dtype=torch.long))


def test_an_unknown_loss_parameter_is_named_with_the_valid_ones() -> None:
    with pytest.raises(
        ValueError, match=r"unknown parameter\(s\) for loss 'grpo': clip_hihg, foo; valid: .*clip_high"
    ):
        make_loss_params("grpo", clip_hihg=0.3, foo=1)
    with pytest.raises(ValueError, match="top_ratio"):  # a STARE parameter is not a grpo_ds one
        make_loss_params("grpo_ds", top_ratio=0.2)


def test_params_of_the_wrong_loss_are_refused() -> None:
    with pytest.raises(ValueError, match=r"params for loss 'stare' must be StareParams"):
        compute_policy_loss("stare", PolicyLossInputs(**good_fields()), make_loss_params("grpo_ds"))


def test_an_unknown_aggregation_mode_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="agg_mode 'mean' is not one of token-mean, seq-mean-token-mean"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 3), "mean")
    with pytest.raises(ValueError, match="agg_mode"):
        make_loss_params("grpo", agg_mode="sum")


# ------------------------------------------------------------------------------------ shapes


@pytest.mark.parametrize("field", ["old_logprob", "response_mask", "entropy", "ref_logprob", "token_weights"])
def test_a_per_token_input_of_the_wrong_shape_is_named(field: str) -> None:
    with pytest.raises(ValueError, match=rf"{field} shape \(2, 4\) must equal logprob shape \(2, 3\)"):
        PolicyLossInputs(**{**good_fields(), field: torch.zeros(2, 4)})


@pytest.mark.parametrize("shape", [(3,), (2, 4), (2, 3, 1)])
def test_advantages_of_the_wrong_shape_are_named(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="advantages shape"):
        PolicyLossInputs(**{**good_fields(), "advantages": torch.zeros(shape)})


def test_a_logprob_that_is_not_two_dimensional_is_named() -> None:
    with pytest.raises(ValueError, match=r"logprob must be \(B, T\)"):
        PolicyLossInputs(**{**good_fields(), "logprob": torch.zeros(6)})


@pytest.mark.parametrize("field", ["global_token_count", "global_sequence_count"])
@pytest.mark.parametrize("value", [-1.0, math.nan])
def test_negative_or_nan_global_counts_are_named(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        PolicyLossInputs(**{**good_fields(), field: value})


def test_kernel_target_shape_mismatch_is_named() -> None:
    with pytest.raises(ValueError, match=r"target_ids shape \(2, 4\) must equal logits shape"):
        token_stats_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_integer_logits_are_refused() -> None:
    with pytest.raises(ValueError, match="logits must be a floating-point tensor"):
        token_stats_from_logits(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, dtype=torch.long))


@pytest.mark.parametrize("chunk_rows", [0, -3, 2.5])
def test_non_positive_or_fractional_chunk_rows_are_named(chunk_rows: Any) -> None:
    with pytest.raises(ValueError, match="chunk_rows must be a positive integer"):
        token_stats_from_logits(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), chunk_rows=chunk_rows)


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.nan, math.inf])
def test_non_positive_or_non_finite_temperature_is_named(temperature: float) -> None:
    logits, targets = torch.zeros(2, 5), torch.zeros(2, dtype=torch.long)
    for call in (
        lambda: token_stats_from_logits(logits, targets, temperature=temperature),
        lambda: token_stats_reference(logits, targets, temperature=temperature),
    ):
        with pytest.raises(ValueError, match="temperature must be a positive finite number"):
            call()


def test_advantage_inputs_of_the_wrong_shape_or_type_are_named() -> None:
    with pytest.raises(ValueError, match="rewards must be 1-D"):
        compute_advantages("grpo", torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"group_ids shape \(3,\) must equal rewards shape \(2,\)"):
        compute_advantages("grpo", torch.ones(2), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="group_ids must be an integer tensor"):
        compute_advantages("dr_grpo", torch.ones(2), torch.zeros(2))
    with pytest.raises(ValueError, match="eps must be non-negative"):
        compute_advantages("grpo", torch.ones(2), torch.zeros(2, dtype=torch.long), eps=-1.0)


# ------------------------------------------------------------------------------------ ranges


@pytest.mark.parametrize("value", [-0.1, 1.5, math.nan, math.inf])
def test_stare_p_outside_zero_one_is_named(value: float) -> None:
    with pytest.raises(ValueError, match="top_ratio"):
        make_loss_params("stare", top_ratio=value)


@pytest.mark.parametrize("value", [0.0, 1e-9, 0.5, 1.0])
def test_stare_p_inside_zero_one_is_accepted(value: float) -> None:
    params = make_loss_params("stare", top_ratio=value)
    assert isinstance(params, StareParams) and params.top_ratio == value


@pytest.mark.parametrize("value", [0.99, 0.0, -1.0, math.inf])
def test_w_below_one_is_named(value: float) -> None:
    with pytest.raises(ValueError, match="reweight_w"):
        make_loss_params("stare", reweight_w=value)
    with pytest.raises(ValueError, match="reweight_w"):
        StareControllerState(gate_on=True, reweight_w=value, reweight_m=0.9)


@pytest.mark.parametrize("value", [1.01, 0.0, -0.5, math.nan])
def test_m_above_one_or_not_positive_is_named(value: float) -> None:
    with pytest.raises(ValueError, match="reweight_m"):
        make_loss_params("stare", reweight_m=value)
    with pytest.raises(ValueError, match="reweight_m"):
        StareControllerState(gate_on=True, reweight_w=1.1, reweight_m=value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("target_entropy", -0.1),
        ("target_entropy", math.nan),
        ("alpha", -0.01),
        ("w_max", 0.9),
        ("m_min", 0.0),
        ("m_min", 1.2),
    ],
)
def test_gate_parameters_out_of_range_are_named(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        StareGateSettings(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [("variant", "C3"), ("scope", "global")],
)
def test_stare_choices_are_named(field: str, value: str) -> None:
    with pytest.raises(ValueError, match=field):
        make_loss_params("stare", **{field: value})


def test_rsi_bounds_in_the_wrong_order_are_named() -> None:
    with pytest.raises(ValueError, match=r"r_lo must be ≤ r_hi, got r_lo=2.5 > r_hi=2.0"):
        make_loss_params("rsi_s", r_lo=2.5)
    with pytest.raises(ValueError, match="r_lo must be ≥ 0"):
        make_loss_params("rsi_s", r_lo=-0.5)
    with pytest.raises(ValueError, match="r_hi must be a quantile level"):
        make_loss_params("rsi_s", bound_mode="quantile", r_lo=0.1, r_hi=2.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("bound_mode", "adaptive"), ("denominator", "some"), ("entropy_eps", 0.0)],
)
def test_rsi_choices_are_named(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        make_loss_params("rsi_s", **{field: value})


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("grpo", "clip_low", 1.0),
        ("grpo", "clip_low", -0.1),
        ("grpo", "clip_high", -0.1),
        ("grpo_ds", "dual_clip_c", 1.0),
        ("grpo_ds", "kl_beta", -0.1),
        ("grpo_ds", "kl_beta", math.nan),
        ("forking_8020", "top_entropy_ratio", 0.0),
        ("forking_8020", "top_entropy_ratio", 1.1),
        ("clip_cov", "clip_cov_ratio", 1.5),
        ("clip_cov", "cov_lower", 6.0),
        ("kl_cov", "kl_cov_ratio", -0.1),
        ("kl_cov", "kl_cov_coef", -1.0),
    ],
)
def test_loss_parameters_out_of_range_are_named(name: str, field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        make_loss_params(name, **{field: value})


@pytest.mark.parametrize("value", [True, "0.2", None])
def test_non_numeric_loss_parameters_are_named(value: Any) -> None:
    with pytest.raises(ValueError, match="clip_low must be a finite number"):
        make_loss_params("grpo", clip_low=value)


def test_missing_inputs_a_loss_needs_are_named() -> None:
    with pytest.raises(ValueError, match=r"rsi_s needs inputs\.entropy"):
        compute_policy_loss("rsi_s", PolicyLossInputs(**good_fields()))
    with pytest.raises(ValueError, match=r"forking_8020 needs inputs\.entropy"):
        compute_policy_loss("forking_8020", PolicyLossInputs(**good_fields()))
    with pytest.raises(ValueError, match="ref_logprob is required when kl_beta > 0"):
        compute_policy_loss("grpo", PolicyLossInputs(**good_fields()), kl_beta=0.1)


def test_overlong_penalty_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="max_length"):
        overlong_penalty(torch.tensor([1]), max_length=0, cache_length=1)
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(torch.tensor([1]), max_length=10, cache_length=0)
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(torch.tensor([1]), max_length=10, cache_length=11)


def test_a_non_positive_generation_budget_is_named() -> None:
    with pytest.raises(ValueError, match="max_response_length"):
        aggregate(torch.zeros(2, 3), torch.ones(2, 3), "seq-mean-token-sum-norm", max_response_length=0)


# ------------------------------------------------------------------------------------ enum-like strings


@pytest.mark.parametrize("variant", ["c2", "o1", "C3", ""])
def test_an_unknown_stare_variant_is_refused_naming_the_valid_ones(variant: str) -> None:
    # "c2" used to behave as O1 without a word.
    from trainer.algos.stare import stare_weights

    with pytest.raises(ValueError, match=r"variant must be one of O1, C2"):
        stare_weights(
            torch.ones(1, 3), torch.ones(1), torch.ones(1, 3),
            top_ratio=0.5, reweight_w=1.1, reweight_m=0.9, variant=variant, gate_on=True,
        )  # fmt: skip


def test_an_unknown_rsi_bound_mode_is_refused_naming_the_valid_ones() -> None:
    from trainer.algos.rsi import rsi_keep_mask

    with pytest.raises(ValueError, match=r"mode must be one of fixed, quantile"):
        rsi_keep_mask(
            torch.ones(1, 3), torch.ones(1, 3), torch.ones(1, 3), mode="quantiles", low=0.1, high=0.9
        )


def test_unknown_engine_choices_are_refused_naming_the_valid_ones() -> None:
    from trainer.policy.update import lr_factor

    with pytest.raises(ValueError, match=r"schedule must be one of constant, linear, cosine"):
        lr_factor("Cosine", 3, warmup_steps=0, steps=10)
    assert lr_factor("cosine", 0, warmup_steps=0, steps=10) == 1.0
