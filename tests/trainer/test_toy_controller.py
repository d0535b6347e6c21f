"""Adding a controller is one declaration (tests/trainer/toy_law.py, as a module of contract/control would be)
and one actuator (its loss, here), registered under one name, and nothing else: from then on a spec names it,
the engine runs it, its state is checkpointed and resumed, and its metrics are in the catalogue."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from torch import Tensor

from contract import algorithms, metrics
from contract import control as controllers
from contract.hyperparams import ClipLossParams
from contract.spec import TrainSpec
from trainer.algos.control import register_actuator, unregister_actuator
from trainer.algos.surrogate import Metrics, PolicyLossInputs, clipped_surrogate, finish, prepare
from trainer.engine import Engine, ExitCode

from .test_engine import read_events, small_spec, step_metrics
from .toy_law import NAME, TOY, ToyState


def toy_loss(
    inputs: PolicyLossInputs, p: ClipLossParams, control: ToyState | None = None
) -> tuple[Tensor, Metrics]:
    """The toy's actuator: grpo_ds's per-token loss scaled by (1 + output)."""
    logprob, old, adv, mask = prepare(inputs)
    per_token, out, _ = clipped_surrogate(logprob, old, adv, mask, p)
    scale = 1.0 + (control.output if control is not None else 0.0)
    return finish(per_token * scale, inputs, p, out)


@pytest.fixture
def toy() -> Iterator[None]:
    controllers.register(TOY)
    register_actuator(NAME)(toy_loss)
    try:
        yield
    finally:
        unregister_actuator(NAME)
        controllers.unregister(NAME)


def _spec(steps: int) -> TrainSpec:
    data = small_spec(optim={"steps": steps}, checkpoint={"interval": 1, "keep_last": 5})
    data["algorithm"] = {"control": {"controller": NAME, "level": 0.5, "target_entropy": 1.0}}
    return TrainSpec.model_validate(data)


def test_a_toy_law_is_registered_validated_run_checkpointed_resumed_and_catalogued(
    toy: None, tmp_path: Path
) -> None:
    # registered: the law is a controller and, having its own algorithm, an algorithm
    assert NAME in controllers.names() and algorithms.get(NAME).controller == NAME
    # validated from a spec: the control section names it, and the job is that algorithm
    spec = _spec(steps=3)
    assert spec.algorithm.name == NAME and spec.algorithm.control is not None
    assert spec.algorithm.control.model_dump()["level"] == 0.5
    with pytest.raises(ValueError, match="level"):
        TrainSpec.model_validate({"algorithm": {"control": {"controller": NAME, "level": 2.0}}})
    # in the metric catalogue
    assert {"toy/output", "toy/updates"} <= {m.key for m in metrics.catalogue()}
    # run, checkpointed: the state after step 2 is in the checkpoint
    whole = tmp_path / "whole"
    assert Engine(spec, whole).run() == ExitCode.OK
    full = step_metrics(read_events(whole))
    assert [full[s]["toy/output"] for s in (1, 2, 3)] == [0.5, 0.5, 0.5]
    assert [full[s]["toy/updates"] for s in (1, 2, 3)] == [1.0, 2.0, 3.0]
    part = tmp_path / "part"
    assert Engine(_spec(steps=2), part).run() == ExitCode.OK
    saved = json.loads((part / "checkpoints" / "step-000002" / "state.json").read_text())
    assert ToyState.from_dict(saved["controllers"][NAME]).updates == 2
    # resumed: the state continues from the checkpoint (3 updates at step 3, not 1)
    assert Engine(_spec(steps=3), part, resume=True).run() == ExitCode.OK
    resumed = step_metrics(read_events(part))
    assert resumed[3]["toy/updates"] == 3.0 and resumed[3]["toy/output"] == full[3]["toy/output"]
    assert resumed[3]["entropy/mean"] == full[3]["entropy/mean"]


def test_the_toy_leaves_nothing_behind_once_removed(toy: None) -> None:
    assert NAME in controllers.names()


def test_without_the_toy_the_registries_do_not_know_it() -> None:
    assert NAME not in controllers.names()
    with pytest.raises(ValueError, match="unknown controller"):
        TrainSpec.model_validate({"algorithm": {"control": {"controller": NAME}}})
