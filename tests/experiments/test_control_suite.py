"""The entropy-control plan (experiments/control_suite.py) and the plant estimator (experiments/plant.py):
every cell's runs are valid job specs with the arms the issue names, and the estimator recovers the drift
and gain of synthetic runs built from the model it fits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from contract.spec import TrainSpec
from experiments import control_suite as cs
from experiments import plant
from experiments.plan import OPTIONAL_SUITES


@pytest.mark.parametrize("cell", cs.CELLS)
def test_every_cell_is_a_resumable_suite_of_valid_specs(cell: str) -> None:
    suite = OPTIONAL_SUITES[cell]()
    assert suite.name == cell and suite.stability
    for arm in suite.arms:
        assert sorted(r.seed for r in suite.runs if r.arm == arm) == [0, 1, 2]
    for run in suite.runs:
        spec = TrainSpec.model_validate(run.spec)
        if run.arm == "default":  # the default law: a target and no algorithm named
            assert "name" not in run.spec["algorithm"] and spec.algorithm.name == "entropy_pi"
        assert spec.algorithm.name in ("grpo_ds", "entropy_pi", "stare_pi", "clip_pi")
        # clip_pi's actuator, the ratio clip, binds only off-policy: its arm takes a second epoch
        assert spec.optim.ppo_epochs == (2 if run.arm == "clip_pi" or cell == "control-clip2" else 1)
    if cell == "control-clip2":  # clip_pi's plant check: clip_pi and grpo_ds, both at two epochs
        assert suite.arms == ("grpo_ds", "clip_pi")
        return
    assert suite.runs[0].arm == "default"
    smollm2 = suite.runs[0].spec["model"]["name"] == "smollm2-135m-instruct"
    # The PI arms of STARE and clip-higher run on the SmolLM2 cells; grpo_ds where no run of it exists.
    assert ("stare_pi" in suite.arms) == smollm2
    assert ("grpo_ds" in suite.arms) == (cell in ("control-gym", "control-tiny", "control-tool"))


def test_the_cells_targets() -> None:
    targets = {
        c: TrainSpec.model_validate(OPTIONAL_SUITES[c]().runs[0].spec).algorithm.target() for c in cs.CELLS
    }
    assert targets["control-tune"].relative == 0.7 and targets["control-t0.5"].relative == 0.5
    assert targets["control-t0.8"].relative == 0.8 and targets["control-abs"].nats == cs.ABSOLUTE_TARGET


def _write_run(folder: Path, entropies: list[float], extra: list[dict[str, float]] | None = None) -> None:
    folder.mkdir(parents=True)
    with open(folder / "events.jsonl", "w", encoding="utf-8") as fh:
        for i, h in enumerate(entropies):
            metrics = {"entropy/mean": h, **((extra or [{}] * len(entropies))[i])}
            fh.write(json.dumps({"type": "step", "step": i + 1, "metrics": metrics}) + "\n")


def test_the_plant_estimator_recovers_drift_and_gains(tmp_path: Path) -> None:
    # Noise-free runs of the model itself: grpo_ds falls by δ = 0.05 a step in ln H; the bonus at α = 0.1
    # gains β = 0.3 per unit α; STARE at W = 4 (gate on) gains 0.01 per unit W − 1.
    steps = 45
    lr = tmp_path / "runs" / "lr"

    def series(push: float) -> list[float]:
        return [math.exp(-(0.05 - push) * k) for k in range(steps)]

    for seed in ("seed0", "seed1"):
        _write_run(lr / "grpo_ds" / seed, series(0.0))
        _write_run(lr / "adaptive_entropy" / seed, series(0.03), [{"entropy_bonus/coef": 0.1}] * steps)
        stare = [{"stare/gate_on": 1.0, "stare/reweight_w": 4.0}] * steps
        _write_run(lr / "stare_w4" / seed, series(0.03), stare)
    est = {e.name: e for e in plant.estimate_lr(lr)}
    assert est["drift δ (per step)"].value == pytest.approx(0.05) and est["drift δ (per step)"].seeds == 2
    assert est["gain β of adaptive_entropy (per coefficient)"].value == pytest.approx(0.3)
    assert est["gain β of stare_w4 (per unit of W − 1)"].value == pytest.approx(0.01)
    assert plant.main([str(tmp_path / "runs")]) == 0
    assert plant.main([str(tmp_path)]) == 2  # no folder with a grpo_ds run: said, not a traceback


def test_the_gym_cell_uses_chain_sums_own_params_and_its_measured_start_accuracy_is_in_range() -> None:
    from experiments.smollm2 import START_ACCURACY_RANGE
    from trainer.tasks.sources import make_train_eval

    suite = OPTIONAL_SUITES["control-gym"]()
    for run in suite.runs:  # not a+b's operations/min_operand/max_operand merged in
        assert run.spec["task"]["params"] == cs.GYM_TASK["task"]["params"]
        assert run.spec["verifier"] == {"name": "reasoning_gym", "params": {"extract": "last_number"}}
    spec = TrainSpec.model_validate(suite.runs[0].spec)
    t = spec.task
    train, held_out = make_train_eval(
        t.source, name=t.name, path=t.path, size=64, eval_size=8, seed=0, params=t.params
    )
    assert train and len(held_out) == 8
    # The measurement the cell rests on (experiments/control_suite.py's docstring): the cell's own sampling,
    # enough prompts for a ±0.05 interval, the whole interval inside the required range.
    record = json.loads((Path(cs.__file__).parent / "start_accuracy_gym.json").read_text())["gym/cell"]
    assert record["temperature"] == spec.evaluation.temperature and record["k"] == spec.evaluation.k
    assert record["max_new_tokens"] == spec.sampling.max_new_tokens
    low, high = record["sampled_interval95"]
    assert record["prompts"] >= 384 and high - low <= 0.1
    assert START_ACCURACY_RANGE[0] <= low and high <= START_ACCURACY_RANGE[1]
