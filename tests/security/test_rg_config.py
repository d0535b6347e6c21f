"""The reasoning-gym config allow-list (trainer/tasks/rg_config.py, issue 44 R1) against the installed package:
every field reviewed, the refused ones refused naming the field, the allowed ones still generating, and the
trainer refusing what the API refuses."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from trainer.tasks import make_examples, rg_config


def _package_fields() -> dict[tuple[str, str], Any]:
    from reasoning_gym.factory import DATASETS

    return {
        (task, field.name): field
        for task, (_, config_class) in DATASETS.items()
        for field in dataclasses.fields(config_class)
        if field.name not in rg_config.RESERVED
    }


def test_every_field_of_the_installed_package_is_a_number_or_reviewed() -> None:
    fields = _package_fields()
    unreviewed = sorted(key for key in fields if key[1] not in rg_config.field_kinds(key[0]))
    assert unreviewed == [], f"reasoning-gym fields neither numeric nor in rg_config.RULES: {unreviewed}"
    stale = sorted(set(rg_config.RULES) - set(fields))
    assert stale == [], f"rg_config.RULES names fields the package no longer has: {stale}"
    numeric = [key for key in fields if key not in rg_config.RULES]
    assert all(isinstance(rg_config.field_kinds(t)[f], rg_config.NumberField) for t, f in numeric)


@pytest.mark.parametrize(
    ("task", "config", "field", "code"),
    [
        ("spell_backward", {"data_file": "/etc/machine-id"}, "data_file", "forbidden_field"),
        ("spell_backward", {"data_file": "../../../../etc/passwd"}, "data_file", "forbidden_field"),
        ("spell_backward", {"data_file": "words3to10.txt"}, "data_file", "forbidden_field"),  # even its own
        (
            "composite",
            {"datasets": [{"name": "chain_sum", "weight": 1, "config": {}}]},
            "datasets",
            "forbidden_field",
        ),
        ("arc_agi", {"board_format_opts": {"col_delimiter": "x"}}, "board_format_opts", "forbidden_field"),
        ("time_intervals", {"min_date": "1900-01-01"}, "min_date", "forbidden_field"),
        ("figlet_font", {"static_font": "../../../../etc/passwd"}, "static_font", "invalid_config"),
        ("figlet_font", {"static_word": "/etc/passwd"}, "static_word", "invalid_config"),
        ("basic_arithmetic", {"operators": ["__import__('os').system('id')"]}, "operators", "invalid_config"),
        ("caesar_cipher", {"delimiter": "http://127.0.0.1/"}, "delimiter", "invalid_config"),
        ("count_primes", {"max_n": 10**10}, "max_n", "invalid_config"),
        ("count_primes", {"max_n": 1e300}, "max_n", "invalid_config"),
        ("count_primes", {"max_n": True}, "max_n", "invalid_config"),
        ("chain_sum", {"../../x": 1}, "../../x", "invalid_config"),
        ("aiw", {"male_names": ["Bob", "x" * 40]}, "male_names", "invalid_config"),
        ("rearc", {"rng_difficulty_ranges": [[0, 2]]}, "rng_difficulty_ranges", "invalid_config"),
    ],
)
def test_what_the_allow_list_refuses_names_the_field(
    task: str, config: dict[str, Any], field: str, code: str
) -> None:
    with pytest.raises(rg_config.ConfigError) as raised:
        rg_config.check_config(task, config, "spec.task.params")
    assert (raised.value.field, raised.value.code) == (f"spec.task.params.{field}", code)
    assert str(raised.value).startswith(f"spec.task.params.{field}")
    # the trainer refuses it the same way, before the generator sees it
    with pytest.raises(ValueError, match=f"task\\.params\\.{field}"):
        make_examples("reasoning_gym", name=task, size=1, seed=0, params=config)


def _allowed_values(rule: rg_config.Rule) -> list[Any]:
    """Values a reviewed rule accepts: every option (a list field: all of them, and the first alone)."""
    if isinstance(rule, rg_config.Choice):
        options = list(rule.options[:3])
        return [options, options[:1]] if rule.many else options
    if isinstance(rule, rg_config.Words):
        word = {"[a-z]": "x", r"[a-z]{1,20}": "red"}.get(rule.pattern, "Alice")
        return [[word]] if rule.many else [word]
    if isinstance(rule, rg_config.Numbers):
        return [[[0.1, 0.2]]] if rule.pairs else [[1.0]]
    return []


ALLOWED = [
    (task, field, value)
    for (task, field), rule in sorted(rg_config.RULES.items())
    for value in _allowed_values(rule)
    if task != "figlet_font" or field != "static_font"
]


# A list field whose weights must match it: (the weights' field, how many more weights than items).
COMPANIONS = {
    ("aiw", "task_types"): ("task_type_weights", 0),
    ("arc_agi", "rotations"): ("rotations_weights", 1),  # plus "no rotation"
    ("arc_agi", "mirrors"): ("mirrors_weights", 1),  # plus "no mirror"
    ("complex_arithmetic", "operations"): ("operations_weights", 0),
    ("intermediate_integration", "problem_types"): ("problem_type_weights", 0),
    ("simple_equations", "operators"): ("operators_weights", 0),
    ("rearc", "rng_difficulty_ranges"): ("rng_difficulty_weights", 0),
    ("rearc", "pso_difficulty_ranges"): ("pso_difficulty_weights", 0),
}
WEIGHTS = {(task, weights) for (task, _), (weights, _) in COMPANIONS.items()}


@pytest.mark.parametrize(("task", "field", "value"), [case for case in ALLOWED if case[:2] not in WEIGHTS])
def test_what_the_allow_list_takes_still_generates(task: str, field: str, value: Any) -> None:
    config = {field: value}
    if (task, field) in COMPANIONS:
        weights, extra = COMPANIONS[task, field]
        count = len(value) + extra
        config[weights] = [1.0 / count] * count  # some tasks want them to sum to 1
    checked = rg_config.check_config(task, config, "p")
    assert make_examples("reasoning_gym", name=task, size=1, seed=0, params=checked)
