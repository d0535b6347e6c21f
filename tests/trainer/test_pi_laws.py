"""The PI laws in the trainer: their actuators' losses against naive references, the default law of a spec
that sets a target and names no algorithm, and a checkpoint + resume of the tiny model that continues the
controller's state exactly."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from contract.control.pi import EntropyPiSettings, PiState, StarePiSettings, pi_step
from contract.spec import TrainSpec
from trainer.algos import compute_policy_loss
from trainer.algos.losses import PolicyLossInputs
from trainer.algos.pi_control import entropy_bonus_term, stare_pi_weights
from trainer.algos.stare import StareControllerState
from trainer.engine import Engine, ExitCode

from .test_engine import read_events, small_spec, step_metrics


def _inputs(entropy_grad: bool = False) -> PolicyLossInputs:
    g = torch.Generator().manual_seed(1)
    logprob = (-torch.rand(4, 6, generator=g) * 3 - 0.05).requires_grad_(True)
    entropy = torch.rand(4, 6, generator=g).requires_grad_(entropy_grad)
    mask = torch.ones(4, 6)
    mask[1, 4:] = 0
    return PolicyLossInputs(
        logprob=logprob,
        old_logprob=logprob.detach() + 0.1 * torch.randn(4, 6, generator=g),
        advantages=torch.tensor([1.0, -0.5, 0.7, -1.2]),
        response_mask=mask,
        entropy=entropy,
    )


@pytest.mark.parametrize("coef", [0.3, -0.2, 0.0])
def test_entropy_pi_loss_is_grpo_ds_minus_alpha_times_the_token_mean_entropy(coef: float) -> None:
    inputs = _inputs(entropy_grad=True)
    loss, metrics = compute_policy_loss("entropy_pi", inputs, control=PiState(output=1.0, actuator=coef))
    base, _ = compute_policy_loss("grpo_ds", inputs)
    # Naive reference: token-mean over the active tokens, entropy by loops.
    total, count = 0.0, 0
    for b in range(4):
        for t in range(6):
            if inputs.response_mask[b, t]:
                total += float(inputs.entropy[b, t].detach())
                count += 1
    assert float(loss.detach()) == pytest.approx(float(base.detach()) - coef * total / count, abs=1e-6)
    assert float(metrics["entropy_bonus/coef"]) == pytest.approx(coef)
    if coef != 0:  # the bonus carries its gradient into the entropy: −α / N per active token
        loss.backward()
        assert inputs.entropy.grad is not None
        expected = -coef * inputs.response_mask / count
        assert torch.allclose(inputs.entropy.grad, expected, atol=1e-7)


def test_entropy_bonus_term_is_elementwise() -> None:
    per_token, entropy = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.5, 0.25]])
    assert torch.equal(entropy_bonus_term(per_token, entropy, -2.0), torch.tensor([[2.0, 2.5]]))


def test_stare_pi_with_a_raised_w_is_stares_loss_with_that_w() -> None:
    inputs = _inputs()
    settings = StarePiSettings(target_entropy=1.0)
    for variant in ("O1", "C2"):
        w, m = stare_pi_weights(0.3, settings)
        mine, _ = compute_policy_loss(
            "stare_pi", inputs, control=PiState(output=0.3, actuator=w, actuator_m=m), variant=variant
        )
        gate = StareControllerState(gate_on=True, reweight_w=w, reweight_m=m)
        theirs, _ = compute_policy_loss("stare", inputs, control=gate, variant=variant)
        assert float(mine) == pytest.approx(float(theirs), abs=1e-7)
    assert stare_pi_weights(-1.0, settings) == pytest.approx((0.1, 1.5))  # the mirror side, bounded


def test_stare_pi_and_clip_pi_at_rest_are_grpo_ds() -> None:
    inputs = _inputs()
    base, _ = compute_policy_loss("grpo_ds", inputs)
    for name in ("stare_pi", "clip_pi"):
        loss, _ = compute_policy_loss(name, inputs, control=None)
        assert float(loss) == pytest.approx(float(base), abs=1e-7)


def test_clip_pi_moves_clip_high() -> None:
    inputs = _inputs()
    mine, _ = compute_policy_loss("clip_pi", inputs, control=PiState(output=-0.5, actuator=0.05))
    theirs, _ = compute_policy_loss("grpo_ds", inputs, clip_high=0.05)
    assert float(mine) == pytest.approx(float(theirs), abs=1e-7)


# ------------------------------------------------------------------------------------------ the spec


def _algorithm(data: dict, algorithm: dict) -> dict:
    return {**data, "algorithm": algorithm}


def test_a_target_without_a_named_algorithm_gets_the_default_law() -> None:
    spec = TrainSpec.model_validate(_algorithm(small_spec(), {"control": {"target_entropy": 0.5}}))
    assert spec.algorithm.name == "entropy_pi"
    settings = spec.algorithm.controller_settings(0.5)
    assert (settings.kp, settings.ki) == pytest.approx((2.4, 0.2667))  # poles at 0.8 on B = 0.15
    assert (settings.u_max, settings.u_min) == (1.0, 0.1)
    # Existing names keep their behaviour: the default algorithm is still STARE with its gate.
    assert TrainSpec.model_validate({}).algorithm.name == "stare"
    assert (
        TrainSpec.model_validate(_algorithm(small_spec(), {"name": "stare_pi"})).algorithm.control is not None
    )


@pytest.mark.parametrize(
    ("algorithm", "field"),
    [
        ({"name": "grpo_ds", "control": {}}, "algorithm.control"),
        ({"name": "stare", "control": {"controller": "entropy_pi"}}, "algorithm.control"),
        ({"control": {"kp": -1.0}}, "kp"),
        ({"control": {"smoothing": 1.0}}, "smoothing"),
        ({"name": "stare_pi", "control": {"u_max": 2.0}}, "u_max"),
        ({"control": {"target_entropy": 0.0}}, "target_entropy"),
        ({"name": "clip_pi"}, "optim.ppo_epochs"),  # one epoch: the ratio clip cannot bind
    ],
)
def test_a_bad_control_section_is_refused_naming_the_field(algorithm: dict, field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        TrainSpec.model_validate(_algorithm(small_spec(), algorithm))


# ------------------------------------------------------------------------------------------ the engine

CONTROL_KEYS = ("control/output", "control/error", "control/integral", "control/actuator", "entropy/mean")


def test_the_default_law_runs_and_a_resume_continues_its_state_exactly(tmp_path: Path) -> None:
    data = _algorithm(
        small_spec(optim={"steps": 4}, checkpoint={"interval": 2, "keep_last": 5}),
        {"control": {"target_entropy": {"relative": 1.5}}},
    )
    whole = tmp_path / "whole"
    assert Engine(TrainSpec.model_validate(data), whole).run() == ExitCode.OK
    full = step_metrics(read_events(whole))
    assert all(full[s]["control/output"] != 0 for s in full)  # the law acted (entropy below 1.5 × H₀)
    assert all(abs(full[s]["control/output"]) <= 1.0 for s in full)
    # The same job stopped after step 2 and resumed from its checkpoint.
    part = tmp_path / "part"
    short = TrainSpec.model_validate({**data, "optim": {**data["optim"], "steps": 2}})
    assert Engine(short, part).run() == ExitCode.OK
    state = json.loads((part / "checkpoints" / "step-000002" / "state.json").read_text())
    saved = PiState.from_dict(state["controllers"]["entropy_pi"])
    # The saved state is the law replayed on the logged H̄ of steps 1-2 (the target: 1.5 × H̄ of step 1).
    settings = EntropyPiSettings(target_entropy=1.5 * full[1]["entropy/mean"])
    replayed = PiState()
    for step in (1, 2):
        replayed = pi_step(replayed, full[step]["entropy/mean"], settings)
    assert (saved.updates, saved.integral, saved.output) == (2, replayed.integral, replayed.output)
    assert Engine(TrainSpec.model_validate(data), part, resume=True).run() == ExitCode.OK
    resumed = step_metrics(read_events(part))
    for step in (3, 4):
        assert {k: resumed[step][k] for k in CONTROL_KEYS} == {k: full[step][k] for k in CONTROL_KEYS}


def test_clip_pi_acts_only_off_policy(tmp_path: Path) -> None:
    """One update per batch: every ratio is 1 and the clip binds no token (why a spec with clip_pi and one
    epoch is refused). With a second epoch the ratio moves and clip_pi's ε_high binds."""
    on_policy = _algorithm(small_spec(optim={"steps": 2, "lr": 0.05}), {"name": "grpo_ds"})
    assert Engine(TrainSpec.model_validate(on_policy), tmp_path / "on").run() == ExitCode.OK
    on = step_metrics(read_events(tmp_path / "on"))
    assert all(m["clip/fraction"] == 0.0 and m["kl/approx_old"] == 0.0 for m in on.values())
    with pytest.raises(ValidationError, match=r"optim\.ppo_epochs"):
        TrainSpec.model_validate(_algorithm(on_policy, {"name": "clip_pi"}))
    off_policy = _algorithm(
        small_spec(optim={"steps": 2, "lr": 0.05, "ppo_epochs": 2}),
        {"name": "clip_pi", "control": {"target_entropy": {"relative": 0.5}}},
    )
    assert Engine(TrainSpec.model_validate(off_policy), tmp_path / "off").run() == ExitCode.OK
    off = step_metrics(read_events(tmp_path / "off"))
    assert any(m["clip/fraction"] > 0.0 for m in off.values())
    # ε_high is the law's: clip_high + span·u, recorded as the actuator.
    assert all(m["control/actuator"] == pytest.approx(0.28 + 0.2 * m["control/output"]) for m in off.values())


def test_a_pi_state_round_trips_exactly() -> None:
    state = replace(PiState(), integral=0.123456789, output=-0.5, smoothed=0.7, saturated_steps=3, updates=9)
    assert PiState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
