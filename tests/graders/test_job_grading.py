"""A training job with a grader, end to end in the engine: a grader that raises on every sample ends the
job grader_failed (exit code 4, an error event naming the first failure and showing its traceback) after
one step; one that fails on a few samples trains on, its failures counted in the step's grader metrics;
a source that does not load refuses the job before it starts (a user error)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from contract.protocol import ExitCode
from contract.spec import TrainSpec
from trainer.engine import Engine
from trainer.graders.pool import GraderSetupError

RAISES = "def grade(sample, item):\n    return {}['missing']\n"
RARELY = (
    "def grade(sample, item):\n"
    "    if item['answer'].endswith('7') and sample['output_text'].startswith('1'):\n"
    "        raise ValueError('seven')\n"
    "    return float(sample['output_text'].strip() == item['answer'])\n"
)


def _spec(source: str, **grading: Any) -> TrainSpec:
    return TrainSpec.model_validate(
        {
            "task": {"source": "arithmetic", "train_size": 64, "eval_size": 4},
            "grader": {"type": "python", "name": "g", "source": source},
            "grading": {"workers": 1, "limits": {"timeout_s": 10}, **grading},
            "sampling": {"group_size": 4, "max_new_tokens": 4},
            "optim": {"steps": 3, "prompts_per_step": 4, "micro_batch_size": 16},
            "evaluation": {"interval": 0},
            "checkpoint": {"interval": 100},
        }
    )


def _events(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def test_a_grader_that_always_raises_ends_the_job_grader_failed(
    grader_environment: None, tmp_path: Path
) -> None:
    code = Engine(_spec(RAISES), tmp_path, progress=False).run()
    assert code == ExitCode.GRADER_FAILED
    error = [e for e in _events(tmp_path) if e["type"] == "error"][-1]
    assert error["code"] == "grader_failed" and error["step"] == 1
    assert "the first failure, at step 1: exception: KeyError: 'missing'" in error["message"]
    assert (
        "Traceback (most recent call last)" in error["message"] and "return {}['missing']" in error["message"]
    )
    assert not [e for e in _events(tmp_path) if e["type"] == "step"]  # no update on a batch of failures


def test_a_grader_that_rarely_fails_trains_on(grader_environment: None, tmp_path: Path) -> None:
    assert Engine(_spec(RARELY, max_error_rate=0.5), tmp_path, progress=False).run() == ExitCode.OK
    steps = [e["metrics"] for e in _events(tmp_path) if e["type"] == "step"]
    assert len(steps) == 3
    assert all(m["grader/samples"] == 16 for m in steps)
    assert all(0 <= m["grader/error_rate"] <= 0.5 and m["grader/seconds"] > 0 for m in steps)


def test_a_source_that_does_not_load_refuses_the_job(grader_environment: None, tmp_path: Path) -> None:
    engine = Engine(_spec("def grade(sample):\n    return 1.0\n"), tmp_path, progress=False)
    with pytest.raises(GraderSetupError, match="two arguments"):
        engine.run()
