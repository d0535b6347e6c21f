"""One registration per algorithm (contract.algorithms): the spec, the losses and the engine read the same
names, parameter classes, estimators and properties; defaults are defined once."""

from __future__ import annotations

import pytest

from contract import algorithms
from contract.algorithms import ADVANTAGE_ESTIMATOR_NAMES, ALGORITHMS, make_loss_params
from contract.control.stare_gate import StareGateSettings, initial_state
from contract.hyperparams import ClipLossParams, StareParams
from contract.spec import TrainSpec


def test_the_losses_and_estimators_registered_in_the_trainer_are_the_contracts() -> None:
    from trainer.algos import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

    assert POLICY_LOSSES.names() == algorithms.names()
    assert ADVANTAGE_ESTIMATORS.names() == sorted(ADVANTAGE_ESTIMATOR_NAMES)
    for name, entry in ALGORITHMS.items():
        assert POLICY_LOSSES.get(name).params_cls is entry.params_cls


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_zero_advantage_inertness_is_the_registrations_and_off_with_a_kl_penalty(name: str) -> None:
    from trainer.algos import zero_advantage_rows_inert

    entry = algorithms.get(name)
    assert zero_advantage_rows_inert(name, make_loss_params(name)) is entry.zero_advantage_inert
    assert algorithms.zero_advantage_rows_inert(name, make_loss_params(name)) is entry.zero_advantage_inert
    assert algorithms.zero_advantage_rows_inert(name, make_loss_params(name, kl_beta=0.1)) is False


def test_the_spec_resolves_each_algorithms_estimator_from_its_registration() -> None:
    for name, entry in ALGORITHMS.items():
        info = entry.controller_info
        epochs = 2 if info is not None and info.needs_off_policy else 1  # clip_pi: its clip binds off-policy
        spec = TrainSpec.model_validate({"algorithm": {"name": name}, "optim": {"ppo_epochs": epochs}})
        assert spec.algorithm.estimator == entry.advantage_estimator
        assert isinstance(make_loss_params(name), ClipLossParams)


def test_stare_defaults_are_defined_once() -> None:
    assert (StareParams().reweight_w, StareParams().reweight_m) == (1.1, 0.9)
    spec = TrainSpec.model_validate({"algorithm": {"name": "stare", "params": {"reweight_w": 1.3}}})
    assert spec.algorithm.control == StareGateSettings()  # the gate's settings: one declaration
    params = make_loss_params("stare", **spec.algorithm.params)
    start = initial_state(spec.algorithm.control, params)  # W and M start at the loss's values
    assert (start.gate_on, start.reweight_w, start.reweight_m) == (True, 1.3, StareParams().reweight_m)
    default = initial_state(None, make_loss_params("grpo_ds"))  # a loss without them: STARE's defaults
    assert (default.reweight_w, default.reweight_m) == (StareParams().reweight_w, StareParams().reweight_m)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: algorithms.get("ppo"), "unknown algorithm 'ppo'; valid: adaptive_entropy, clip_cov"),
        (
            lambda: algorithms.check_estimator("rloo"),
            "unknown advantage estimator 'rloo'; valid: grpo, dr_grpo",
        ),
        (lambda: make_loss_params("ppo"), "unknown policy loss 'ppo'"),
        (lambda: make_loss_params("stare", gate="on"), "unknown parameter.*'stare': gate"),
        (lambda: make_loss_params("stare", variant="C3"), "variant must be one of 'O1', 'C2', got 'C3'"),
        (lambda: make_loss_params("stare", scope="batch"), "scope must be one of"),
        (lambda: make_loss_params("rsi_s", bound_mode="adaptive"), "bound_mode must be one of"),
        (lambda: make_loss_params("rsi_s", denominator="some"), "denominator must be one of"),
        (lambda: make_loss_params("grpo", agg_mode="sum"), "agg_mode 'sum' is not one of"),
        (lambda: make_loss_params("grpo", clip_low=True), "clip_low must be a finite number"),
    ],
)
def test_an_unknown_name_or_choice_is_refused_listing_the_valid_ones(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        call()


def test_an_algorithm_cannot_be_registered_twice() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        algorithms.register(algorithms.get("stare"))
