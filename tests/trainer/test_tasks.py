"""Task sources: the arithmetic generator, reasoning-gym tasks, JSONL files, held-out splits, prompt rendering,
and the promise that tasks/verifiers/catalog import no torch."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainer.tasks import rg_safety, verifiers
from trainer.tasks.sources import (
    Example,
    JsonlFormatError,
    LineError,
    jsonl_errors,
    load_jsonl,
    make_examples,
    make_train_eval,
    render_prompt,
    split_train_eval,
    validate_jsonl_lines,
    validate_template,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

# --- arithmetic -------------------------------------------------------------------------------------------

_PROMPT_RE = re.compile(r"^(-?\d+)([+\-*])(\d+|\(-\d+\))=$")


def _evaluate(prompt: str) -> int:
    match = _PROMPT_RE.match(prompt)
    assert match, prompt
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3).strip("()"))
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def test_example_is_frozen_with_empty_meta_by_default():
    example = Example("1+1=", "2")
    assert example.meta == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        example.answer = "3"  # type: ignore[misc]


def test_arithmetic_defaults_are_two_digit_additions_with_right_answers():
    examples = make_examples("arithmetic", size=300, seed=0)
    assert len(examples) == 300
    for example in examples:
        a, b = map(int, example.prompt[:-1].split("+"))
        assert 0 <= a <= 99 and 0 <= b <= 99
        assert example.answer == str(a + b)
    assert examples[0].prompt.endswith("=")


def test_arithmetic_is_deterministic_for_a_seed():
    params = {"operations": ["+", "-", "*"], "min_operand": -20, "max_operand": 20}
    first = make_examples("arithmetic", size=200, seed=7, params=params)
    assert first == make_examples("arithmetic", size=200, seed=7, params=params)
    assert first != make_examples("arithmetic", size=200, seed=8, params=params)
    assert {_PROMPT_RE.match(e.prompt).group(2) for e in first} == {"+", "-", "*"}  # type: ignore[union-attr]
    assert any("(-" in e.prompt for e in first)  # negative right operands are bracketed
    for example in first:
        assert example.answer == str(_evaluate(example.prompt))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"operations": ["/"]}, "unknown"),
        ({"operations": []}, "non-empty"),
        ({"operations": "+"}, "non-empty list"),
        ({"min_operand": 5, "max_operand": 1}, "exceeds"),
        ({"max_operand": 9.5}, "integer"),
        ({"digits": 2}, "unknown arithmetic param"),
    ],
)
def test_arithmetic_rejects_bad_params(params, message):
    with pytest.raises(ValueError, match=message):
        make_examples("arithmetic", size=5, seed=0, params=params)


def test_make_examples_rejects_bad_sources_and_sizes(tmp_path):
    with pytest.raises(ValueError, match="valid: arithmetic, reasoning_gym, jsonl"):
        make_examples("gsm8k", size=5, seed=0)
    with pytest.raises(ValueError, match="size must be a positive integer"):
        make_examples("arithmetic", size=0, seed=0)
    with pytest.raises(ValueError, match="does not take 'path'"):
        make_examples("arithmetic", path="x.jsonl", size=5, seed=0)
    with pytest.raises(ValueError, match="needs a task name"):
        make_examples("reasoning_gym", size=5, seed=0)
    with pytest.raises(ValueError, match="needs a path"):
        make_examples("jsonl", size=5, seed=0)


# --- reasoning-gym ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["basic_arithmetic", "chain_sum"])
def test_reasoning_gym_tasks_build_and_their_answers_score_one(task):
    examples = make_examples("reasoning_gym", name=task, size=4, seed=1)
    assert len(examples) == 4
    assert [e.prompt for e in examples] == [
        e.prompt for e in make_examples("reasoning_gym", name=task, size=4, seed=1)
    ]
    for example in examples:
        assert example.prompt and example.answer
        assert example.meta["reasoning_gym"]["task"] == task
        assert "entry" not in example.meta["reasoning_gym"]  # rebuilt for scoring, never carried
        assert rg_safety.rebuild_entry(example.meta["reasoning_gym"])[1]["answer"] == example.answer
        assert verifiers.score("reasoning_gym", example.answer, example) == 1.0
        assert verifiers.score("reasoning_gym", f"<answer>{example.answer}</answer>", example) == 1.0
        assert verifiers.score("reasoning_gym", "no idea", example) < 1.0


def test_reasoning_gym_params_reach_the_task_config():
    examples = make_examples(
        "reasoning_gym", name="chain_sum", size=6, seed=2, params={"min_terms": 5, "max_terms": 5}
    )
    for example in examples:
        assert rg_safety.rebuild_entry(example.meta["reasoning_gym"])[1]["metadata"]["num_terms"] == 5
        assert verifiers.score("reasoning_gym", example.answer, example) == 1.0


def test_unknown_reasoning_gym_task_names_it_and_suggests():
    with pytest.raises(ValueError, match=r"unknown reasoning-gym task 'countdwn'; did you mean countdown"):
        make_examples("reasoning_gym", name="countdwn", size=2, seed=0)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"no_such_field": 1}, "task.params.no_such_field: unknown field of task 'chain_sum'"),
        ({"seed": 3}, "may not set"),
    ],
)
def test_reasoning_gym_rejects_bad_params(params, message):
    with pytest.raises(ValueError, match=message):
        make_examples("reasoning_gym", name="chain_sum", size=2, seed=0, params=params)


# --- JSONL ------------------------------------------------------------------------------------------------


def test_jsonl_validation_numbers_each_kind_of_error():
    lines = [
        b'{"prompt": "1+1=", "answer": "2"}\n',
        b"\xff\xfe not utf-8\n",
        b"{not json}\n",
        b'["prompt", "answer"]\n',
        b'{"answer": "2"}\n',
        b'{"prompt": "1+1=", "answer": 2}\n',
        b"\n",  # blank lines are skipped
        b'{"prompt": "  ", "answer": "2"}\n',
        b'{"prompt": "1+1=", "answer": "2", "meta": [1]}\r\n',
        b'{"prompt": "2+2=", "answer": "4", "meta": {"k": 1}, "id": 7}',
    ]
    errors = validate_jsonl_lines(lines)
    assert [(e.line, e.code, e.field) for e in errors] == [
        (2, "not_utf8", None),
        (3, "invalid_json", None),
        (4, "not_object", None),
        (5, "missing_field", "prompt"),
        (6, "wrong_type", "answer"),
        (8, "empty_field", "prompt"),
        (9, "wrong_type", "meta"),
        (10, "unknown_key", "id"),
    ]
    assert "offset 0" in errors[0].message
    assert str(errors[3]) == "line 5: missing field 'prompt'"
    assert json.loads(json.dumps([e.to_dict() for e in errors]))[0]["line"] == 2


def test_jsonl_validation_names_unknown_keys_and_says_how_to_fix_a_type():
    lines = [
        b'{"question": "1+1=", "answer": "2"}\n',
        b'{"prompt": "1+1=", "answer": 2, "colour": "red"}\n',
        b'{"prompt": "1+1=", "answer": ["2"]}\n',
    ]
    errors = validate_jsonl_lines(lines)
    assert [(e.line, e.code, e.field) for e in errors] == [
        (1, "unknown_key", "question"),  # not also "missing field 'prompt'": the key that stands for it
        (2, "wrong_type", "answer"),
        (2, "unknown_key", "colour"),
        (3, "wrong_type", "answer"),
    ]
    assert str(errors[0]) == "line 1: unknown key `question`; did you mean `prompt`?"
    assert errors[1].message == "answer must be a string, not a number: quote it"
    assert errors[2].message == "unknown key `colour`; the keys are prompt, answer, meta"
    assert errors[3].message == "answer must be a string, not a list"
    assert len(list(jsonl_errors([b'{"prompt": 1, "answer": 2}\n'] * 300))) == 600  # no cap


def test_the_loader_still_reads_a_stored_file_with_other_keys(tmp_path):
    stored = tmp_path / "before.jsonl"  # uploaded before unknown keys were refused
    stored.write_text('{"prompt": "1+1=", "answer": "2", "id": 7}\n', encoding="utf-8")
    assert load_jsonl(stored) == [Example("1+1=", "2")]


def test_jsonl_validation_of_empty_files_boms_and_error_caps():
    assert validate_jsonl_lines([]) == [LineError(0, "empty_file", "the file has no records")]
    assert [e.code for e in validate_jsonl_lines([b"\n", b"   \n"])] == ["empty_file"]
    assert validate_jsonl_lines([b'\xef\xbb\xbf{"prompt": "p", "answer": "a"}\n']) == []
    assert len(validate_jsonl_lines([b"nope\n"] * 50, max_errors=10)) == 10


def test_jsonl_loader_reads_records_and_reports_bad_files(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(
        '{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": "q", "answer": "a", "meta": {"src": "x"}}\n',
        encoding="utf-8",
    )
    assert load_jsonl(good) == [Example("1+1=", "2"), Example("q", "a", {"src": "x"})]
    assert make_examples("jsonl", path=str(good), size=1, seed=0) == [Example("1+1=", "2")]
    assert len(make_examples("jsonl", path=str(good), size=0, seed=0)) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"prompt": "p", "answer": "a"}\n{"prompt": "p"}\n')
    with pytest.raises(JsonlFormatError, match="line 2: missing field 'answer'") as caught:
        load_jsonl(bad)
    assert [(e.line, e.code) for e in caught.value.errors] == [(2, "missing_field")]


# --- held-out splits --------------------------------------------------------------------------------------


def test_split_train_eval_is_deterministic_and_disjoint():
    examples = [Example(f"{i}+0=", str(i)) for i in range(50)] + [Example("7+0=", "7")]  # one duplicate
    train, held_out = split_train_eval(examples, 10, seed=0)
    assert (train, held_out) == split_train_eval(examples, 10, seed=0)
    assert split_train_eval(examples, 10, seed=1)[1] != held_out
    assert len(held_out) == 10 and len({e.prompt for e in held_out}) == 10
    assert not {e.prompt for e in train} & {e.prompt for e in held_out}
    assert len(train) + len(held_out) >= 50
    assert split_train_eval(examples, 0, seed=0) == (examples, [])
    with pytest.raises(ValueError, match="cannot hold out"):
        split_train_eval(examples, 50, seed=0)


def test_generated_held_out_set_comes_from_another_stream_without_train_prompts():
    train, held_out = make_train_eval(
        "arithmetic", size=300, eval_size=40, seed=0, params={"max_operand": 20}
    )
    assert len(train) == 300 and len(held_out) == 40
    assert not {e.prompt for e in train} & {e.prompt for e in held_out}
    assert len({e.prompt for e in held_out}) == 40
    assert (train, held_out) == make_train_eval(
        "arithmetic", size=300, eval_size=40, seed=0, params={"max_operand": 20}
    )
    rg_train, rg_held_out = make_train_eval("reasoning_gym", name="chain_sum", size=20, eval_size=5, seed=0)
    assert len(rg_held_out) == 5 and not {e.prompt for e in rg_train} & {e.prompt for e in rg_held_out}


def test_generated_held_out_set_fails_clearly_when_the_task_is_too_small():
    # 0..1 with "+" has four distinct prompts; 100 training draws take them all.
    with pytest.raises(ValueError, match="held-out prompts"):
        make_train_eval("arithmetic", size=100, eval_size=2, seed=0, params={"max_operand": 1})


def test_jsonl_held_out_split(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "answer": str(i)}) + "\n" for i in range(30)))
    train, held_out = make_train_eval("jsonl", path=str(path), size=10, eval_size=5, seed=0)
    assert len(train) == 10 and len(held_out) == 5
    assert not {e.prompt for e in train} & {e.prompt for e in held_out}


# --- prompt rendering -------------------------------------------------------------------------------------


class _ChatTokenizer:
    chat_template = "stub"

    def __init__(self) -> None:
        self.calls: list[tuple[list[dict[str, str]], dict[str, object]]] = []

    def apply_chat_template(self, messages, **kwargs):
        self.calls.append((messages, kwargs))
        return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"


def test_render_prompt_templates():
    example = Example("12+34=", "46")
    assert render_prompt(example, None) == "12+34="
    assert render_prompt(example, "Q: {prompt}\nA:") == "Q: 12+34=\nA:"
    assert render_prompt(Example("{x}", "1"), "{{literal}} {prompt}") == "{literal} {x}"
    for bad, message in [
        ("no field", "must contain"),
        ("{prompt} {answer}", "unknown field"),
        ("{prompt", "bad"),
    ]:
        with pytest.raises(ValueError, match=message):
            validate_template(bad)


def test_render_prompt_with_a_chat_template():
    tokenizer = _ChatTokenizer()
    example = Example("What is 2+3?", "5")
    text = render_prompt(
        example, "{prompt} Answer briefly.", tokenizer, use_chat_template=True, system_prompt="S"
    )
    assert text == "system:S|user:What is 2+3? Answer briefly.|assistant:"
    assert tokenizer.calls[0][1] == {"tokenize": False, "add_generation_prompt": True}
    assert render_prompt(example, None, tokenizer, use_chat_template=False) == "What is 2+3?"


def test_render_prompt_with_real_tokenizers():
    from trainer.models import build_tiny_arith_tokenizer

    tokenizer = build_tiny_arith_tokenizer()
    example = Example("1+2=", "3")
    # No chat template: the plain text, even when asked for one.
    assert render_prompt(example, None, tokenizer, use_chat_template=True) == "1+2="
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    assert render_prompt(example, None, tokenizer, use_chat_template=True) == "<user>1+2=<assistant>"


# --- layering ---------------------------------------------------------------------------------------------


def test_tasks_verifiers_and_catalog_import_no_torch():
    script = textwrap.dedent(
        """
        import sys
        from contract import catalog
        from trainer.tasks import sources, verifiers
        examples = sources.make_examples("arithmetic", size=3, seed=0)
        assert verifiers.score("exact", examples[0].answer, examples[0]) == 1.0
        assert verifiers.score("math_verify", "\\\\boxed{1/2}", sources.Example("q", "0.5")) == 1.0
        rg = sources.make_examples("reasoning_gym", name="chain_sum", size=1, seed=0)[0]
        assert verifiers.score("reasoning_gym", rg.answer, rg) == 1.0
        assert sources.validate_jsonl_lines([b'{"prompt": "p", "answer": "a"}']) == []
        assert catalog.BUILTIN_MODELS
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "transformers", "accelerate"})
        assert not heavy, heavy[:5]
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


# --- reasoning-gym meta in a file -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("meta", "code", "field"),
    [
        (
            {"task": "chain_sum", "seed": 0, "size": 1, "index": 0, "entry": {"answer": "1"}},
            "forbidden_field",
            "meta.reasoning_gym.entry",
        ),
        (
            {"task": "spiral_matrix", "seed": 0, "size": 1, "index": 0},
            "unsafe_task",
            "meta.reasoning_gym.task",
        ),
        ({"task": "chain_sum", "seed": 0, "size": 2, "index": 2}, "invalid_meta", "meta.reasoning_gym.index"),
        ({"task": "chain_sum", "seed": 0, "size": 1}, "invalid_meta", "meta.reasoning_gym.index"),
        (
            {"task": "chain_sum", "seed": 0, "size": 1, "index": 0, "x": 1},
            "invalid_meta",
            "meta.reasoning_gym.x",
        ),
        ("chain_sum", "invalid_meta", "meta.reasoning_gym"),
    ],
)
def test_a_lines_reasoning_gym_meta_is_checked_naming_the_field(meta, code, field, tmp_path):
    line = json.dumps({"prompt": "p", "answer": "a", "meta": {"reasoning_gym": meta}}).encode()
    [error] = validate_jsonl_lines([line])
    assert (error.line, error.code, error.field) == (1, code, field)
    path = tmp_path / "t.jsonl"
    path.write_bytes(line + b"\n")
    with pytest.raises(JsonlFormatError, match=re.escape(field)):
        load_jsonl(path)


def test_any_exception_from_reasoning_gym_generation_is_a_value_error_in_our_words():
    # word_ladder raises IndexError here: the message is ours, never the generator's (issue 44, R1)
    with pytest.raises(ValueError) as raised:
        make_examples(
            "reasoning_gym",
            name="word_ladder",
            size=1,
            seed=0,
            params={"min_chain_length": 200, "max_chain_length": 200},
        )
    assert str(raised.value) == "reasoning-gym task 'word_ladder' cannot generate with these params"
    with pytest.raises(ValueError, match=r"task\.params\.datasets is not accepted"):  # composite: refused
        make_examples("reasoning_gym", name="composite", size=1, seed=0, params={"datasets": "x"})
