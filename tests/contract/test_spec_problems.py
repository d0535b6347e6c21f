"""contract.suggest and contract.spec_problems: the nearest valid name, and a spec's validation errors as
problems at exact field paths in plain words (issue 46, item 3)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from contract.spec import TrainSpec
from contract.spec_problems import fields_of, spec_problems, unknown_name_problems
from contract.suggest import edit_distance, nearest


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [("", "", 0), ("grpo", "grpo", 0), ("grop", "grpo", 1), ("kitten", "sitting", 3), ("lr", "", 2)],
)
def test_edit_distance_counts_a_swap_of_neighbours_as_one_edit(a: str, b: str, distance: int) -> None:
    assert edit_distance(a, b) == distance == edit_distance(b, a)


@pytest.mark.parametrize(
    ("name", "valid", "expected"),
    [
        ("learning_rate", ["lr", "steps", "schedule"], "lr"),  # another trainer's name
        ("learning_rate", ["steps"], None),  # an alias only where its counterpart is valid
        ("max_tokens", ["max_new_tokens", "group_size"], "max_new_tokens"),
        ("grop", ["grpo", "dapo", "stare"], "grpo"),
        ("Exact", ["exact", "numeric"], "exact"),  # case does not count
        ("question", ["prompt", "answer", "meta"], "prompt"),
        ("w_d", ["wd", "weight_decay"], "wd"),
        ("colour", ["name", "model", "task"], None),  # nothing close: no guess
        ("lr", ["lr", "steps"], None),  # already valid
    ],
)
def test_nearest_prefers_aliases_then_initials_then_edit_distance(
    name: str, valid: list[str], expected: str | None
) -> None:
    assert nearest(name, valid) == expected


def problems_of(spec: dict[str, Any]) -> dict[str, tuple[str, str, str | None]]:
    with pytest.raises(ValidationError) as caught:
        TrainSpec.model_validate(spec)
    return {p.field: (p.code, p.message, p.suggestion) for p in spec_problems(caught.value, TrainSpec)}


def test_every_section_is_reported_at_once_at_its_field() -> None:
    found = problems_of(
        {
            "optim": {"learning_rate": 1e-3, "steps": 0},
            "evaluation": {"k": 4},
            "model": {"dtype": "fp16"},
            "sampling": {"temperature": "warm"},
            "seed": -1,
        }
    )
    assert found == {
        "optim.learning_rate": ("unknown_field", "unknown field; did you mean `lr`?", "lr"),
        "optim.steps": ("out_of_range", "must be ≥ 1, not 0", None),
        "evaluation.k": ("invalid_value", found["evaluation.k"][1], None),
        "model.dtype": ("invalid_value", '"fp16" is not one of float32, bfloat16', None),
        "sampling.temperature": ("wrong_type", 'must be a number, not "warm"', None),
        "seed": ("out_of_range", "must be ≥ 0, not -1", None),
    }
    assert found["evaluation.k"][1].startswith("evaluation.k must be 1 when evaluation.greedy is true")
    assert "on by default" in found["evaluation.k"][1]


def test_a_validator_naming_its_field_is_reported_there_without_the_library_prefix() -> None:
    found = problems_of({"algorithm": {"name": "clip_pi"}, "entropy_band": {"low": 2.0, "high": 1.0}})
    assert set(found) == {"optim.ppo_epochs", "entropy_band.low"}
    assert found["optim.ppo_epochs"][1].startswith("clip_pi steers the ratio clip")
    assert not any("Value error" in message for _, message, _ in found.values())


def test_unknown_names_are_split_per_name_each_with_its_suggestion() -> None:
    found = problems_of({"algorithm": {"name": "grpo", "params": {"clip_hihg": 0.3, "zzz": 1}}})
    assert found["algorithm.params.clip_hihg"][2] == "clip_high"
    assert found["algorithm.params.zzz"][0] == "unknown_field" and found["algorithm.params.zzz"][2] is None
    assert problems_of({"verifier": {"name": "numerc"}})["verifier.name"][2] == "numeric"
    assert problems_of({"algorithm": {"name": "grop"}})["algorithm.name"][2] == "grpo"
    assert unknown_name_problems("x", "something else went wrong") is None


def test_an_unknown_field_lists_the_valid_ones_when_none_is_close() -> None:
    code, message, suggestion = problems_of({"checkpoint": {"colour": 1}})["checkpoint.colour"]
    assert (code, suggestion) == ("unknown_field", None)
    assert message == "unknown field; valid: interval, keep_last, training_state"
    assert fields_of(TrainSpec, ["task", "params"]) is None  # a free-form map has no field list
    assert fields_of(TrainSpec, ["algorithm", "control"]) is None  # the controller's settings class varies
