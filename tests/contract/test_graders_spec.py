"""Graders in the job spec (contract/graders.py): OpenAI's shapes accepted, every refusal naming its field,
the spec's cross-field rules, and a resolved spec that loads again (the worker runs the stored one)."""

from __future__ import annotations

from typing import Any

import pytest

from contract.graders import MAX_SOURCE_BYTES, GraderError, parse_grader
from contract.spec import TrainSpec

CHECK = {
    "type": "string_check",
    "input": "{{sample.output_text}}",
    "reference": "{{item.answer}}",
    "operation": "eq",
}
PYTHON = {"type": "python", "source": "def grade(sample, item):\n    return 1.0\n"}


@pytest.mark.parametrize(
    ("grader", "field"),
    [
        ({"type": "python", "source": "x" * (MAX_SOURCE_BYTES + 1)}, "grader.source"),
        ({"type": "python", "source": "   "}, "grader.source"),
        ({**PYTHON, "image_tag": "2019-01-01"}, "grader.image_tag"),
        ({**PYTHON, "extra": 1}, "grader.extra"),
        ({**CHECK, "operation": "contains"}, "grader.operation"),
        ({**CHECK, "reference": "{{sample.output_text.len}}"}, "grader.reference"),
        ({**CHECK, "input": "{{ item }}"}, "grader.input"),
        ({"type": "text_similarity", "input": "a", "reference": "b", "evaluation_metric": "cosine"}, "grader.evaluation_metric"),
        ({"type": "label_model"}, "grader.type"),
        ({"type": "nope"}, "grader.type"),
        ([], "grader"),
        ({"type": "multi", "graders": {}, "calculate_output": "1"}, "grader.graders"),
        ({"type": "multi", "graders": {"a-b": CHECK}, "calculate_output": "1"}, "grader.graders"),
        ({"type": "multi", "graders": {"a": {"type": "multi"}}, "calculate_output": "a"}, "grader.graders.a.type"),
        ({"type": "multi", "graders": {"a": {**CHECK, "operation": "x"}}, "calculate_output": "a"}, "grader.graders.a.operation"),
        ({"type": "multi", "graders": {"a": CHECK, "b": CHECK}, "calculate_output": "a"}, "grader.calculate_output"),
        ({"type": "multi", "graders": {"a": CHECK}, "calculate_output": "a +"}, "grader.calculate_output"),
    ],
)  # fmt: skip
def test_every_refusal_names_its_field(grader: Any, field: str) -> None:
    with pytest.raises(GraderError) as refused:
        parse_grader(grader)
    assert refused.value.field == field, refused.value


def test_a_resolved_spec_with_a_grader_loads_again_and_keeps_the_grader() -> None:
    spec = TrainSpec.model_validate({"grader": PYTHON, "grading": {"workers": 1}})
    again = TrainSpec.model_validate(spec.resolved())
    assert again.grader == spec.grader and again.grading == spec.grading


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"verifier": {"name": "numeric"}}, "a verifier or by a grader, not both"),
        ({"reward": {"style": "pm1"}}, "leave style binary"),
    ],
)
def test_a_grader_replaces_the_verifier_and_its_score_is_the_reward(
    extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        TrainSpec.model_validate({"grader": CHECK, **extra})


def test_grading_settings_need_a_grader_and_stay_within_openais_limits() -> None:
    with pytest.raises(ValueError, match="set only with a grader"):
        TrainSpec.model_validate({"grading": {"workers": 1}})
    for field, value in (("timeout_s", 121), ("memory_mb", 4096), ("disk_mb", 2048)):
        with pytest.raises(ValueError, match=field):
            TrainSpec.model_validate({"grader": PYTHON, "grading": {"limits": {field: value}}})
