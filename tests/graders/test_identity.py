"""Acceptance: a python grader that re-implements the `numeric` verifier (examples/graders/numeric_grader.py)
gives, on the demo's tiny spec with the same seed, a run bit-identical to the built-in verifier's for 50
steps: every step's rewards, losses, entropy and the rest of its training metrics equal, to the last bit.
The grader runs in the sandboxed pool of its job (two processes), the verifier in the trainer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from contract.spec import TrainSpec
from trainer.engine import Engine

ROOT = Path(__file__).resolve().parents[2]
STEPS = 50
# Not the run's numbers: timings, and the grader's own health (only the grader run has it).
NOT_COMPARED = ("perf/", "grader/")


def _demo(**changes: Any) -> TrainSpec:
    data = yaml.safe_load((ROOT / "trainer/specs/demo.yaml").read_text())
    data["optim"]["steps"] = STEPS
    data["sft"]["steps"] = 60  # a short warm-start: the comparison is of the RL steps
    data["task"]["eval_size"] = 16
    data["evaluation"] = {"interval": 25, "greedy": False, "k": 2, "temperature": 1.0}
    data["checkpoint"] = {"interval": STEPS, "keep_last": 1}
    data.pop("verifier")
    data.update(changes)
    return TrainSpec.model_validate(data)


def _events(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def _steps(out: Path) -> dict[int, dict[str, float]]:
    return {
        event["step"]: {k: v for k, v in event["metrics"].items() if not k.startswith(NOT_COMPARED)}
        for event in _events(out)
        if event["type"] == "step"
    }


@pytest.mark.slow
def test_a_python_grader_reimplementing_numeric_trains_bit_identically(
    grader_environment: None, tmp_path: Path
) -> None:
    grader = json.loads((ROOT / "examples/graders/grader.json").read_text())
    verifier_spec = _demo(verifier={"name": "numeric"})
    grader_spec = _demo(grader=grader, grading={"workers": 2, "limits": {"timeout_s": 30}})
    assert Engine(verifier_spec, tmp_path / "verifier", progress=False).run() == 0
    assert Engine(grader_spec, tmp_path / "grader", progress=False).run() == 0

    by_verifier, by_grader = _steps(tmp_path / "verifier"), _steps(tmp_path / "grader")
    assert sorted(by_verifier) == list(range(1, STEPS + 1)) == sorted(by_grader)
    for step in by_verifier:
        assert by_grader[step] == by_verifier[step], step  # every metric, exactly (floats compared by ==)
    some = by_verifier[STEPS]
    assert {"reward/mean", "entropy/mean", "reward/accuracy"} <= set(some)
    assert any(key.startswith("loss/") or "loss" in key for key in some)
    rewards = {round(by_verifier[s]["reward/mean"], 6) for s in by_verifier}
    assert len(rewards) > 5  # the rewards moved: the comparison is of a run that learns something
    evals = [e["metrics"] for e in _events(tmp_path / "verifier") if e["type"] == "eval"]
    assert evals == [e["metrics"] for e in _events(tmp_path / "grader") if e["type"] == "eval"]

    grader_steps = [e["metrics"] for e in _events(tmp_path / "grader") if e["type"] == "step"]
    assert all(m["grader/errors"] == 0.0 and m["grader/samples"] == 256.0 for m in grader_steps)
