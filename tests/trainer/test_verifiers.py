"""Verifiers: the registry's validation and JSON description, hand cases for each verifier, the time bound of
math_verify on hostile inputs, and reward shaping."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainer.tasks.sources import Example, make_examples
from trainer.tasks.verifiers import (
    VERIFIERS,
    VerifierError,
    extract_answer,
    get_verifier,
    parse_number,
    score,
    shape_reward,
    validate_params,
)

# --- registry ---------------------------------------------------------------------------------------------


def test_registry_lists_the_four_verifiers_as_json():
    assert set(VERIFIERS) == {"exact", "numeric", "math_verify", "reasoning_gym"}
    described = json.loads(json.dumps([spec.to_dict() for spec in VERIFIERS.values()]))
    exact = next(d for d in described if d["name"] == "exact")
    assert exact["params"]["case_sensitive"] == {
        "type": "bool",
        "default": False,
        "description": "Compare letter case too.",
    }
    assert exact["params"]["extract"]["choices"] == [
        "first_line",
        "full",
        "boxed",
        "last_number",
        "answer_tag",
    ]


def test_unknown_verifier_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown verifier 'regex'; valid: exact, math_verify, numeric"):
        get_verifier("regex")
    with pytest.raises(ValueError, match="unknown verifier"):
        score("regex", "1", Example("q", "1"))


def test_validate_params_fills_defaults_and_names_bad_params():
    assert validate_params("numeric", None) == {"rel_tol": 1e-9, "abs_tol": 1e-6}
    assert validate_params("numeric", {"abs_tol": 1}) == {"rel_tol": 1e-9, "abs_tol": 1.0}
    assert validate_params("exact", {"extract": "boxed"})["extract"] == "boxed"
    bad = [
        ("exact", {"strip": True}, "has no param.*'strip'.*valid: extract, case_sensitive"),
        ("exact", {"case_sensitive": "yes"}, "'case_sensitive' must be true or false"),
        ("exact", {"extract": "last_line"}, "'extract' must be one of"),
        ("numeric", {"abs_tol": -1.0}, "'abs_tol' must be a number >= 0"),
        ("numeric", {"rel_tol": True}, "'rel_tol' must be a number"),
        ("numeric", {"rel_tol": float("nan")}, "'rel_tol' must be a number"),
        ("math_verify", {"max_chars": 0}, "'max_chars' must be an integer >= 1"),
        ("math_verify", {"max_chars": 2.5}, "'max_chars' must be an integer"),
    ]
    for name, params, message in bad:
        with pytest.raises(ValueError, match=message):
            validate_params(name, params)


# --- exact ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "params", "expected"),
    [
        ("46", "46", {}, 1.0),
        ("  46 \n", "46", {}, 1.0),
        ("46\n12+34=46", "46", {}, 1.0),  # first line only
        ("\n\n46\n", "46", {}, 1.0),  # first non-empty line
        ("46<eos>garbage", "46", {}, 1.0),
        ("46<|im_end|>", "46", {}, 1.0),
        ("47", "46", {}, 0.0),
        ("4 6", "46", {}, 0.0),
        ("", "46", {}, 0.0),
        ("Paris", "paris", {}, 1.0),
        ("Paris", "paris", {"case_sensitive": True}, 0.0),
        ("46\nmore", "46", {"extract": "full"}, 0.0),
        (" 46\n ", "46", {"extract": "full"}, 1.0),
        ("so \\boxed{46} done", "46", {"extract": "boxed"}, 1.0),
        ("46", "46", {"extract": "boxed"}, 0.0),  # no box: nothing extracted
        ("it is 4, then 46.", "46", {"extract": "last_number"}, 1.0),
        ("think <answer> 46 </answer>", "46", {"extract": "answer_tag"}, 1.0),
    ],
)
def test_exact(completion, answer, params, expected):
    assert score("exact", completion, Example("q", answer), params) == expected


# --- numeric ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "params", "expected"),
    [
        ("46", "46", {}, 1.0),
        ("The answer is 46.", "46", {}, 1.0),
        ("12+34=46", "46", {}, 1.0),
        ("46.0", "46", {}, 1.0),
        ("x = -4", "-4", {}, 1.0),
        ("x =-4", "-4", {}, 1.0),
        ("10-3", "3", {}, 1.0),  # a binary minus is not a sign
        ("$1,234", "1234", {}, 1.0),
        ("1,234.5", "1234.5", {}, 1.0),
        ("2e3", "2000", {}, 1.0),
        ("3/4", "0.75", {}, 1.0),
        ("\\boxed{\\frac{3}{4}}", "0.75", {}, 1.0),
        ("\\boxed{46} and then 7", "46", {}, 1.0),  # the box wins over the last number
        ("\\boxed{47} and then 46", "46", {}, 0.0),
        ("3.1416", "3.14159", {}, 0.0),
        ("3.1416", "3.14159", {"abs_tol": 1e-3}, 1.0),
        ("103", "100", {"rel_tol": 0.05}, 1.0),
        ("no number here", "46", {}, 0.0),
        ("1/0", "1", {}, 0.0),
    ],
)
def test_numeric(completion, answer, params, expected):
    assert score("numeric", completion, Example("q", answer), params) == expected


def test_numeric_refuses_a_non_numeric_reference():
    with pytest.raises(VerifierError, match="numeric reference"):
        score("numeric", "46", Example("q", "forty-six"))


# --- math_verify ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("\\boxed{46}", "46", 1.0),
        ("so the answer is 46", "46", 1.0),
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("1/2", "\\frac{1}{2}", 1.0),
        ("$\\boxed{1+x}$", "x+1", 1.0),
        ("\\boxed{\\sqrt{4}}", "2", 1.0),
        ("\\boxed{e^{-x^{2}}}", "e^{-x^2}", 1.0),  # a symbolic nested power is not "hostile"
        ("\\boxed{47}", "46", 0.0),
        ("\\boxed{46} but 47", "47", 0.0),  # the box wins
        ("no answer", "46", 0.0),
        ("\\boxed{}", "46", 0.0),
    ],
)
def test_math_verify(completion, answer, expected):
    assert score("math_verify", completion, Example("q", answer)) == expected


@pytest.mark.parametrize(
    "hostile",
    [
        "9^{9^{9^{9}}}",
        "(x+1)^{999}(x-1)^{999}",
        "\\binom{10^{900}}{10^{800}}",
        "\\prod_{k=1}^{10^{9}} k",
        "\\sin(10^{1000})",
        "10^{1000}!",
    ],
)
def test_math_verify_bounds_time_on_hostile_answers(hostile):
    # Each of these spun for minutes (or seconds) inside sympy before the guard.
    start = time.perf_counter()
    assert score("math_verify", f"\\boxed{{{hostile}}}", Example("q", "x+1")) == 0.0
    assert time.perf_counter() - start < 3.0


def test_math_verify_caps_length_and_runs_off_the_main_thread():
    long_answer = "\\boxed{" + "1+" * 140 + "1}"  # 281 characters inside the box
    assert score("math_verify", long_answer, Example("q", "141")) == 0.0
    assert score("math_verify", long_answer, Example("q", "141"), {"max_chars": 300}) == 1.0
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(
            pool.map(lambda c: score("math_verify", c, Example("q", "0.5")), ["\\boxed{1/2}", "3"])
        )
    assert results == [1.0, 0.0]


def test_math_verify_refuses_an_unparsable_reference():
    with pytest.raises(VerifierError, match="cannot parse the reference"):
        score("math_verify", "\\boxed{1}", Example("q", "\\"))


# --- reasoning_gym ----------------------------------------------------------------------------------------


def test_reasoning_gym_needs_the_entry_in_meta():
    with pytest.raises(VerifierError, match=r"meta\['reasoning_gym'\]"):
        score("reasoning_gym", "46", Example("q", "46"))


def test_reasoning_gym_extraction_modes():
    example = make_examples("reasoning_gym", name="chain_sum", size=1, seed=3)[0]
    answer = example.answer
    assert score("reasoning_gym", f"Let me add.\n<answer>{answer}</answer>", example) == 1.0
    assert score("reasoning_gym", f"so \\boxed{{{answer}}}", example) == 1.0
    assert score("reasoning_gym", f"{answer}\nbecause", example) == 1.0
    assert score("reasoning_gym", f"because\n{answer}", example, {"extract": "last_number"}) == 1.0
    assert score("reasoning_gym", "because", example, {"extract": "answer_tag"}) == 0.0


def test_reasoning_gym_meta_from_a_jsonl_line_scores_too():
    # A file carries what rebuilds the entry ({task, config, seed, size, index}) under meta.reasoning_gym.
    generated = make_examples("reasoning_gym", name="basic_arithmetic", size=3, seed=5)[2]
    meta = json.loads(json.dumps(generated.meta))
    assert meta["reasoning_gym"] == {
        "task": "basic_arithmetic",
        "config": {},
        "seed": 5,
        "size": 3,
        "index": 2,
    }
    from_file = Example(generated.prompt, generated.answer, meta)
    assert score("reasoning_gym", generated.answer, from_file) == 1.0


def test_reasoning_gym_refuses_an_entry_in_meta():
    # N5: the entry was taken from the file and bitwise_arithmetic eval()'d its metadata.problem.
    generated = make_examples("reasoning_gym", name="bitwise_arithmetic", size=1, seed=0)[0]
    meta = {**generated.meta["reasoning_gym"], "entry": {"answer": "7", "metadata": {"problem": "7"}}}
    with pytest.raises(VerifierError, match=r"meta\.reasoning_gym\.entry is not accepted"):
        score("reasoning_gym", "7", Example("q", "7", {"reasoning_gym": meta}))


def test_reasoning_gym_refuses_scorers_that_evaluate_the_answer():
    # Generating countdown is fine; its scorer parse_expr()s the completion, so scoring it is refused.
    generated = make_examples("reasoning_gym", name="countdown", size=1, seed=5)[0]
    with pytest.raises(VerifierError, match="reasoning-gym task 'countdown' cannot be scored here"):
        score("reasoning_gym", generated.answer, generated)


# --- shared behaviour -------------------------------------------------------------------------------------


def test_extract_answer_modes():
    text = "work\n\\boxed{\\frac{1}{2}} then 7<answer>x</answer><|im_end|>after 9"
    assert extract_answer(text, "first_line") == "work"
    assert extract_answer(text, "boxed") == "\\frac{1}{2}"
    assert extract_answer(text, "last_number") == "7"
    assert extract_answer(text, "answer_tag") == "x"
    assert extract_answer(text, "full").endswith("</answer>")
    assert extract_answer("\\boxed{unclosed", "boxed") is None


@given(st.text(max_size=60))
def test_cheap_verifiers_score_any_text_within_bounds(text):
    example = Example("q", "46")
    for name in ("exact", "numeric"):
        assert 0.0 <= score(name, text, example) <= 1.0


def test_shape_reward():
    assert shape_reward(1.0, "binary") == 1.0
    assert shape_reward(0.0, "binary") == 0.0
    assert shape_reward(1.0, "pm1") == 1.0
    assert shape_reward(0.0, "pm1") == -1.0
    assert shape_reward(0.25, "pm1") == -0.5  # partial credit maps linearly
    with pytest.raises(ValueError, match="valid: binary, pm1"):
        shape_reward(1.0, "sigmoid")
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        shape_reward(1.5, "binary")


def test_numbers_past_the_range_of_a_float_score_zero_quickly():
    # Found by the hostile-completion suite: Fraction("1e999999999") built 10**999999999 (minutes), and a
    # 5000-digit number raised past int()'s 4300-digit limit, which crashed the training step.
    start = time.perf_counter()
    assert parse_number("1e999999999") is None and parse_number("1e" + "0" * 30 + "99999999") is None
    assert score("numeric", "9" * 5000, Example("q", "9")) == 0.0
    assert score("numeric", "\\boxed{1e999999999}", Example("q", "9")) == 0.0
    assert parse_number("2.5e3") == 2500.0
    assert time.perf_counter() - start < 1.0


def test_a_reasoning_gym_scorer_failing_on_a_completion_scores_zero():
    # propositional_logic's own parser recursed past Python's limit on deep parentheses; that crashed the
    # training step instead of scoring the completion 0.
    example = make_examples("reasoning_gym", name="propositional_logic", size=1, seed=0)[0]
    assert score("reasoning_gym", "(" * 3000 + "P" + ")" * 3000, example) == 0.0
