"""Controllers in the algorithms' registrations: the library refuses what it would ignore, a loss without a
controller refuses a control, states are checked where they enter a loss; targets absolute or relative to
H₀ (resolved on the first RL step, with the band around them, in the events, checkpoints and job view);
the engine names no algorithm."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from contract import algorithms
from contract import control as controllers
from contract.control.entropy_coef import EntropyCoefState
from contract.hyperparams import AdaptiveEntropyParams, EntropyTarget
from contract.spec import TrainSpec
from trainer.algos import compute_policy_loss, make_loss_params
from trainer.algos.control import ACTUATORS
from trainer.algos.losses import PolicyLossInputs
from trainer.algos.stare import StareControllerState
from trainer.controllers import Controllers
from trainer.engine import Engine, ExitCode

from .test_engine import read_events, small_spec, step_metrics

ROOT = Path(__file__).resolve().parents[2]


def loss_inputs() -> PolicyLossInputs:
    g = torch.Generator().manual_seed(0)
    logprob = -torch.rand(3, 4, generator=g) - 0.1
    return PolicyLossInputs(
        logprob=logprob.requires_grad_(True),
        old_logprob=logprob.detach() + 0.05,
        advantages=torch.tensor([1.0, -0.5, 0.0]),
        response_mask=torch.ones(3, 4),
        entropy=torch.rand(3, 4, generator=g),
    )


# ------------------------------------------------------------------------------------------ the library


@pytest.mark.parametrize(("name", "field"), [("stare", "gate_on"), ("adaptive_entropy", "coef")])
def test_a_controlled_value_is_not_a_parameter(name: str, field: str) -> None:
    with pytest.raises(ValueError, match=rf"unknown parameter.*{field}"):
        make_loss_params(name, **{field: 0.5})
    with pytest.raises(TypeError):
        AdaptiveEntropyParams(coef=0.1)  # type: ignore[call-arg]


def test_a_loss_without_a_controller_refuses_a_control() -> None:
    state = StareControllerState(gate_on=True, reweight_w=1.1, reweight_m=0.9)
    with pytest.raises(ValueError, match="loss 'grpo_ds' has no controller"):
        compute_policy_loss("grpo_ds", loss_inputs(), control=state)


def test_a_control_of_the_wrong_type_is_named() -> None:
    with pytest.raises(
        ValueError, match="control for loss 'stare' must be StareControllerState, got EntropyCoef"
    ):
        compute_policy_loss("stare", loss_inputs(), control=EntropyCoefState(coef=0.1))


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: StareControllerState(gate_on=True, reweight_w=0.5, reweight_m=0.9), "reweight_w"),
        (lambda: StareControllerState(gate_on=True, reweight_w=1.1, reweight_m=2.0), "reweight_m"),
        (lambda: StareControllerState(gate_on=1, reweight_w=1.1, reweight_m=0.9), "gate_on"),  # type: ignore[arg-type]
        (lambda: EntropyCoefState(coef=-0.1), "coef"),
        (lambda: EntropyCoefState(coef=0.1, applied=math.nan), "applied"),
    ],
)
def test_an_out_of_bounds_state_is_refused(make, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=field):
        make()


def test_a_state_that_was_changed_after_construction_is_checked_where_it_enters_the_loss() -> None:
    state = StareControllerState(gate_on=True, reweight_w=1.1, reweight_m=0.9)
    object.__setattr__(state, "reweight_w", 0.5)
    with pytest.raises(ValueError, match="reweight_w"):
        compute_policy_loss("stare", loss_inputs(), control=state)


def test_an_override_that_names_no_parameter_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"unknown parameter.*warp"):
        compute_policy_loss("grpo", loss_inputs(), make_loss_params("grpo"), warp=1)


def test_every_registered_controller_has_an_actuator() -> None:
    assert set(ACTUATORS) == set(controllers.CONTROLLERS)
    for name in algorithms.names():
        entry = algorithms.get(name)
        assert entry.measures_entropy_first is (entry.controller is not None)


def test_the_trainer_names_no_algorithm_outside_the_registry() -> None:
    """The engine and its modules read properties of the registration, never an algorithm's name."""
    names = "|".join(re.escape(n) for n in algorithms.names())
    pattern = re.compile(rf"""["']({names})["']""")
    for module in (
        "engine", "policy/update", "policy/scoring", "controllers", "data", "run/events", "policy/placement", "sft",
    ):  # fmt: skip
        text = (ROOT / "trainer" / f"{module}.py").read_text()
        assert not pattern.findall(text), module


# ------------------------------------------------------------------------------------------ the spec


def test_an_old_adaptive_entropy_spec_reads_its_target_from_the_gate_section() -> None:
    spec = TrainSpec.model_validate(
        {"algorithm": {"name": "adaptive_entropy", "gate": {"target_entropy": 0.7}}}
    )
    assert spec.algorithm.control is not None and spec.algorithm.control.controller == "entropy_coef"
    assert spec.algorithm.control.target_entropy == 0.7
    assert spec.algorithm.target() == EntropyTarget(nats=0.7)


def test_a_gate_setting_adaptive_entropy_has_not_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"algorithm\.gate: adaptive_entropy has no gate"):
        TrainSpec.model_validate({"algorithm": {"name": "adaptive_entropy", "gate": {"adaptive": True}}})
    with pytest.raises(ValidationError, match=r"algorithm\.entropy_control: algorithm 'stare'"):
        TrainSpec.model_validate({"algorithm": {"name": "stare", "entropy_control": {"target_entropy": 0.2}}})


@pytest.mark.parametrize("bad", [{"relative": 0}, {"relative": -1.0}, {"relative": 11.0}, {"nats": 0.3}])
def test_a_bad_relative_target_is_refused(bad: dict) -> None:
    with pytest.raises(ValidationError, match="target_entropy"):
        TrainSpec.model_validate({"algorithm": {"name": "stare", "gate": {"target_entropy": bad}}})


def test_relative_and_absolute_targets_resolve() -> None:
    relative = TrainSpec.model_validate(
        {"algorithm": {"name": "stare", "gate": {"target_entropy": {"relative": 0.6}}}}
    )
    loss = make_loss_params("stare")
    c = Controllers(relative, loss)
    assert c.unresolved and c.band is None and c.running == []
    resolved = c.resolve(2.0)
    assert resolved == {
        "target_entropy": 0.6 * 2.0,
        "initial_entropy": 2.0,
        "relative": 0.6,
        "band_low": 0.5 * 0.6 * 2.0,
        "band_high": 2.0 * 0.6 * 2.0,
    }
    assert c.resolve(5.0) is None  # once
    assert c.running[0].bound.settings.nats == 0.6 * 2.0
    restored = Controllers(relative, loss)
    restored.load_state_dict(json.loads(json.dumps(c.state_dict())))
    assert restored.resolved() == c.resolved() and restored.control() == c.control()

    absolute = Controllers(TrainSpec.model_validate({"algorithm": {"name": "stare"}}), loss)
    assert not absolute.unresolved and absolute.target_entropy == 0.3 and absolute.band == (0.1, 1.0)
    assert absolute.resolve(2.0) is None
    set_band = TrainSpec.model_validate(
        {
            "algorithm": {"name": "stare", "gate": {"target_entropy": {"relative": 0.5}}},
            "entropy_band": {"low": 0.2},
        }
    )
    assert Controllers(set_band, loss).band == (0.2, 1.0)  # a band the spec sets is kept


def test_a_checkpoint_written_before_controllers_had_their_keys_restores() -> None:
    spec = TrainSpec.model_validate({"algorithm": {"name": "adaptive_entropy"}})
    c = Controllers(spec, make_loss_params("adaptive_entropy"))
    state = EntropyCoefState(coef=0.02, applied=0.01, batch_entropy=0.4, updates=3)
    c.load_state_dict(
        {
            "controller": {"gate_on": True, "reweight_w": 1.1, "reweight_m": 0.9},
            "entropy_coef": state.to_dict(),
        }
    )
    assert c.control() == state


# ------------------------------------------------------------------------------------------ the engine


def test_a_relative_target_resolves_on_the_first_step_and_survives_a_resume(tmp_path: Path) -> None:
    data = small_spec(
        algorithm={"name": "stare", "gate": {"target_entropy": {"relative": 0.9}}},
        optim={"steps": 2},
        checkpoint={"interval": 1},
    )
    out = tmp_path / "run"
    assert Engine(TrainSpec.model_validate(data), out).run() == ExitCode.OK
    events = read_events(out)
    resolved = [e for e in events if e["type"] == "targets_resolved"]
    steps = step_metrics(events)
    h0 = steps[1]["entropy/mean"]
    assert len(resolved) == 1 and resolved[0]["step"] == 1
    assert resolved[0]["initial_entropy"] == h0 and resolved[0]["target_entropy"] == 0.9 * h0
    for m in steps.values():
        assert m["entropy/target"] == m["stare/target_entropy"] == 0.9 * h0
        assert (m["entropy/band_low"], m["entropy/band_high"]) == (0.5 * 0.9 * h0, 2.0 * 0.9 * h0)
        assert m["stare/gate_on"] == float(m["entropy/mean"] < 0.9 * h0)
    state = json.loads((out / "checkpoints" / "step-000001" / "state.json").read_text())
    assert state["targets"]["target_entropy"] == 0.9 * h0
    longer = TrainSpec.model_validate({**data, "optim": {**data["optim"], "steps": 3}})
    assert Engine(longer, out, resume=True).run() == ExitCode.OK
    after = step_metrics(read_events(out))
    assert after[3]["entropy/target"] == 0.9 * h0  # H₀ of step 1, not of the resumed run's first step
    assert [e for e in read_events(out) if e["type"] == "targets_resolved"] == resolved


def test_the_job_view_says_where_entropy_stands_against_the_target() -> None:
    from service.views import entropy_status

    def status(metrics: dict) -> object:
        return entropy_status(SimpleNamespace(last_metrics=metrics, resolved_spec={}))

    below = status(
        {"entropy/mean": 0.2, "entropy/target": 0.3, "entropy/band_low": 0.1, "entropy/band_high": 1.0}
    )
    assert below.target is not None and (below.target.value, below.target.state) == (0.3, "below")
    assert below.state == "in_band"
    above = status({"entropy/mean": 0.3, "entropy/target": 0.3})
    assert above.target is not None and above.target.state == "at_or_above"
    assert status({"entropy/mean": 0.3}).target is None  # an algorithm without a target
