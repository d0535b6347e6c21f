"""Task sources: where prompts and reference answers come from, and how a prompt becomes model input text.

Three sources, one `Example` type:

- "arithmetic": our own generator of "12+34=" → "46" prompts (operations, operand range, seed).
- "reasoning_gym": any reasoning-gym procedural task by name; `Example.meta["reasoning_gym"]` carries what
  rebuilds its entry ({task, config, seed, size, index}, trainer/tasks/rg_safety.py), never the entry itself, so
  the "reasoning_gym" verifier can score with the task's own score_answer on an entry no tenant wrote.
- "jsonl": a file of {"prompt", "answer"[, "meta"]} objects, one per line, checked line by line first
  (every failing line found, any other key refused by name: `jsonl_errors`).

This module imports neither torch nor transformers (the service validates uploads and specs with it), and it
imports reasoning_gym only when a reasoning-gym task is requested. `render_prompt` takes the tokenizer
duck-typed for the same reason.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import operator
import random
import string
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contract import safejson
from contract.suggest import nearest
from trainer.tasks import rg_config, rg_safety

__all__ = [
    "ARITHMETIC_OPERATIONS",
    "DEFAULT_TEMPLATE",
    "TASK_SOURCES",
    "Example",
    "JsonlFormatError",
    "LineError",
    "check_reasoning_gym_task",
    "derive_seed",
    "generate_arithmetic",
    "generate_reasoning_gym",
    "jsonl_errors",
    "load_jsonl",
    "make_examples",
    "make_train_eval",
    "reasoning_gym_task_names",
    "render_prompt",
    "split_train_eval",
    "validate_jsonl_lines",
    "validate_template",
]

TASK_SOURCES = ("arithmetic", "reasoning_gym", "jsonl")
DEFAULT_TEMPLATE = "{prompt}"
REASONING_GYM_META_KEY = rg_safety.META_KEY


@dataclass(frozen=True)
class Example:
    """One prompt with its reference answer. `meta` holds whatever a verifier needs beyond the answer."""

    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


def derive_seed(seed: int, stream: str) -> int:
    """A 32-bit seed for a named stream, stable across processes and Python versions (unlike hash())."""
    digest = hashlib.sha256(f"{seed}/{stream}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


# --- arithmetic -------------------------------------------------------------------------------------------

ARITHMETIC_OPERATIONS: dict[str, Callable[[int, int], int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
}
_ARITHMETIC_PARAMS = ("operations", "min_operand", "max_operand")


def generate_arithmetic(
    size: int,
    seed: int,
    *,
    operations: Sequence[str] = ("+",),
    min_operand: int = 0,
    max_operand: int = 99,
) -> list[Example]:
    """`size` prompts "a<op>b=" with the exact integer result as answer; deterministic for a seed.

    A negative right operand is written in parentheses ("5-(-3)=") so every prompt reads one way.
    """
    _check_size(size)
    if isinstance(operations, str) or not isinstance(operations, Sequence) or not operations:
        raise ValueError("arithmetic param 'operations' must be a non-empty list, e.g. ['+', '-']")
    unknown = [op for op in operations if op not in ARITHMETIC_OPERATIONS]
    if unknown:
        raise ValueError(
            f"arithmetic param 'operations' has unknown {unknown}; valid: {list(ARITHMETIC_OPERATIONS)}"
        )
    for key, value in (("min_operand", min_operand), ("max_operand", max_operand)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"arithmetic param {key!r} must be an integer, got {value!r}")
    if min_operand > max_operand:
        raise ValueError(f"arithmetic min_operand {min_operand} exceeds max_operand {max_operand}")
    rng = random.Random(seed)
    ops = list(operations)
    examples = []
    for _ in range(size):
        a = rng.randint(min_operand, max_operand)
        b = rng.randint(min_operand, max_operand)
        op = rng.choice(ops)
        right = f"({b})" if b < 0 else str(b)
        examples.append(Example(prompt=f"{a}{op}{right}=", answer=str(ARITHMETIC_OPERATIONS[op](a, b))))
    return examples


def _arithmetic_from_params(size: int, seed: int, params: dict[str, Any]) -> list[Example]:
    unknown = sorted(set(params) - set(_ARITHMETIC_PARAMS))
    if unknown:
        raise ValueError(f"unknown arithmetic param(s) {unknown}; valid: {list(_ARITHMETIC_PARAMS)}")
    return generate_arithmetic(size, seed, **params)


# --- reasoning-gym ----------------------------------------------------------------------------------------


def reasoning_gym_task_names() -> list[str]:
    import reasoning_gym  # noqa: F401 - the whole package first: another thread may be importing it
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def check_reasoning_gym_task(name: str) -> None:
    """Raise ValueError naming `name` and the nearest valid task names when reasoning-gym has no such task."""
    valid = reasoning_gym_task_names()
    if name in valid:
        return
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ValueError(f"unknown reasoning-gym task {name!r}; {hint}valid tasks: {', '.join(valid)}")


def generate_reasoning_gym(
    name: str, size: int, seed: int, params: dict[str, Any] | None = None
) -> list[Example]:
    """`size` entries of reasoning-gym task `name`; `params` are the task's config fields (not size/seed)."""
    import reasoning_gym

    _check_size(size)
    check_reasoning_gym_task(name)
    config = dict(params or {})
    reserved = sorted({"size", "seed"} & set(config))
    if reserved:
        raise ValueError(f"reasoning-gym params may not set {reserved}; use the task's size and seed")
    config = rg_config.check_config(name, config, "task.params")  # the allow-list (issue 44, R1)
    examples = []
    try:  # reasoning-gym raises all kinds on bad params (AttributeError, IndexError, MemoryError, ...)
        dataset = reasoning_gym.create_dataset(name, size=size, seed=seed, **config)
        for index, entry in enumerate(dataset):
            answer = entry.get("answer")
            meta = {"task": name, "config": config, "seed": seed, "size": size, "index": index}
            examples.append(
                Example(
                    prompt=str(entry["question"]),
                    answer="" if answer is None else str(answer),
                    meta={REASONING_GYM_META_KEY: meta},
                )
            )
    except Exception as exc:  # a stable message: the generator's own may name files (issue 44, R1)
        raise ValueError(f"reasoning-gym task {name!r} cannot generate with these params") from exc
    return examples


# --- JSONL files ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LineError:
    """One problem in a JSONL file. `line` is 1-based; 0 means the file as a whole."""

    line: int
    # not_utf8 | invalid_json | not_object | missing_field | wrong_type | empty_field | unknown_key |
    # empty_file, or one of contract.safejson's: nul_character | invalid_unicode | non_finite_number |
    # integer_too_large | too_deep, or of a reasoning-gym meta (rg_safety.MetaError): invalid_meta |
    # forbidden_field | unsafe_task
    code: str
    message: str
    field: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else "file"
        return f"{where}: {self.message}"


class JsonlFormatError(ValueError):
    def __init__(self, source: str, errors: list[LineError]) -> None:
        self.errors = errors
        shown = "; ".join(str(error) for error in errors[:5])
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        super().__init__(f"{source} is not a valid task file: {shown}{more}")


_REQUIRED_STR_FIELDS = ("prompt", "answer")
JSONL_KEYS = ("prompt", "answer", "meta")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    return {type(None): "null", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _parse_line(
    number: int, raw: bytes, strict_keys: bool = True
) -> tuple[dict[str, Any] | None, list[LineError]]:
    """Check one line; a blank line is (None, []). Shared by the validator and the loader."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, [LineError(number, "not_utf8", f"not UTF-8 (bad byte at offset {exc.start})")]
    if number == 1:
        text = text.removeprefix("\ufeff")
    if not text.strip():
        return None, []
    try:
        record = safejson.loads(text)
    except safejson.UnsafeDocument as exc:
        problem = exc.problem
        return None, [LineError(number, problem.code, str(exc), problem.where or None)]
    except json.JSONDecodeError as exc:
        return None, [LineError(number, "invalid_json", f"not JSON: {exc.msg} at column {exc.colno}")]
    if not isinstance(record, dict):
        kind = type(record).__name__
        return None, [LineError(number, "not_object", f"expected a JSON object, got {kind}")]
    errors = _record_errors(number, record, strict_keys)
    return (None, errors) if errors else (record, [])


def _record_errors(number: int, record: dict[str, Any], strict_keys: bool) -> list[LineError]:
    """A JSON object's problems as a task record: its fields, its keys, its meta."""
    errors = []
    meant = {key: nearest(key, JSONL_KEYS) for key in record if strict_keys and key not in JSONL_KEYS}
    for name in _REQUIRED_STR_FIELDS:
        if name not in record and name not in meant.values():
            errors.append(LineError(number, "missing_field", f"missing field {name!r}", name))
        elif name not in record:
            continue  # said below, as the unknown key that stands for it
        elif not isinstance(record[name], str):
            fix = ": quote it" if isinstance(record[name], int | float) else ""
            message = f"{name} must be a string, not {_kind(record[name])}{fix}"
            errors.append(LineError(number, "wrong_type", message, name))
        elif not record[name].strip():
            errors.append(LineError(number, "empty_field", f"field {name!r} is empty", name))
    for key, suggestion in meant.items():
        hint = f"did you mean `{suggestion}`?" if suggestion else f"the keys are {', '.join(JSONL_KEYS)}"
        errors.append(LineError(number, "unknown_key", f"unknown key `{key}`; {hint}", key))
    if "meta" in record and not isinstance(record["meta"], dict):
        kind = type(record["meta"]).__name__
        errors.append(LineError(number, "wrong_type", f"field 'meta' must be an object, got {kind}", "meta"))
    elif REASONING_GYM_META_KEY in record.get("meta", {}):
        try:  # a reasoning-gym entry is rebuilt by our generator, never read from the file
            rg_safety.check_meta(record["meta"][REASONING_GYM_META_KEY])
        except rg_safety.MetaError as exc:
            errors.append(LineError(number, exc.code, str(exc), exc.field))
    return errors


def jsonl_errors(lines: Iterable[bytes], *, strict_keys: bool = True) -> Iterator[LineError]:
    """Every problem of a JSONL task file given as raw byte lines, in line order; none means it loads.

    Each non-blank line must be a UTF-8 JSON object with non-empty string fields "prompt" and "answer" and an
    optional object "meta"; any other key is refused by name (with the key it most likely stands for), unless
    `strict_keys` is False (the trainer's loader: a file stored before that rule still loads). Blank lines
    are skipped; a file with no records is an error.
    """
    records = errors = 0
    for number, raw in enumerate(lines, start=1):
        record, line_errors = _parse_line(number, raw, strict_keys)
        records += record is not None
        errors += len(line_errors)
        yield from line_errors
    if records == 0 and not errors:
        yield LineError(0, "empty_file", "the file has no records")


def validate_jsonl_lines(
    lines: Iterable[bytes], *, max_errors: int = 100, strict_keys: bool = True
) -> list[LineError]:
    """The first `max_errors` problems of `jsonl_errors` (scanning stops there); [] means it loads."""
    return list(itertools.islice(jsonl_errors(lines, strict_keys=strict_keys), max_errors))


def load_jsonl(path: str | Path, *, max_errors: int = 20) -> list[Example]:
    """Examples from a JSONL task file; raises JsonlFormatError listing line-numbered problems."""
    path = Path(path)
    with path.open("rb") as handle:
        lines = handle.readlines()
    errors = validate_jsonl_lines(lines, max_errors=max_errors, strict_keys=False)
    if errors:
        raise JsonlFormatError(str(path), errors)
    examples = []
    for number, raw in enumerate(lines, start=1):
        record, _ = _parse_line(number, raw, strict_keys=False)
        if record is not None:
            meta = record.get("meta") or {}
            examples.append(Example(prompt=record["prompt"], answer=record["answer"], meta=meta))
    return examples


# --- one front door ---------------------------------------------------------------------------------------


def make_examples(
    source: str,
    *,
    name: str | None = None,
    path: str | None = None,
    size: int,
    seed: int,
    params: dict[str, Any] | None = None,
) -> list[Example]:
    """Examples from `source` ("arithmetic" | "reasoning_gym" | "jsonl").

    arithmetic: `params` are operations / min_operand / max_operand. reasoning_gym: `name` is the task and
    `params` its config. jsonl: `path` is the file, read in file order and cut to the first `size` records
    (size 0 = all); `seed` is unused and `params` must be empty.
    """
    params = dict(params or {})
    if source == "arithmetic":
        _forbid(source, path=path)
        if name not in (None, "arithmetic"):
            raise ValueError(f"source 'arithmetic' takes no task name, got {name!r}")
        return _arithmetic_from_params(size, seed, params)
    if source == "reasoning_gym":
        _forbid(source, path=path)
        if not name:
            raise ValueError("source 'reasoning_gym' needs a task name, e.g. 'chain_sum'")
        return generate_reasoning_gym(name, size, seed, params)
    if source == "jsonl":
        _forbid(source, name=name, params=params or None)
        if not path:
            raise ValueError("source 'jsonl' needs a path")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"size must be a non-negative integer for a JSONL file, got {size!r}")
        examples = load_jsonl(path)
        return examples[:size] if size else examples
    raise ValueError(f"unknown task source {source!r}; valid: {', '.join(TASK_SOURCES)}")


def split_train_eval(
    examples: Sequence[Example], eval_size: int, seed: int
) -> tuple[list[Example], list[Example]]:
    """Hold out `eval_size` examples with distinct prompts; train keeps the rest, minus any example sharing a
    prompt with the held-out set. Deterministic for a seed; train keeps the input order."""
    if isinstance(eval_size, bool) or not isinstance(eval_size, int) or eval_size < 0:
        raise ValueError(f"eval_size must be a non-negative integer, got {eval_size!r}")
    if eval_size == 0:
        return list(examples), []
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    held_out: list[Example] = []
    held_prompts: set[str] = set()
    for index in order:
        if len(held_out) == eval_size:
            break
        if examples[index].prompt not in held_prompts:
            held_out.append(examples[index])
            held_prompts.add(examples[index].prompt)
    train = [example for example in examples if example.prompt not in held_prompts]
    if len(held_out) < eval_size or not train:
        raise ValueError(
            f"cannot hold out {eval_size} distinct prompts and keep a training set: "
            f"{len(examples)} examples, {len({e.prompt for e in examples})} distinct prompts"
        )
    return train, held_out


_EVAL_ROUNDS = 6


def make_train_eval(
    source: str,
    *,
    name: str | None = None,
    path: str | None = None,
    size: int,
    eval_size: int,
    seed: int,
    params: dict[str, Any] | None = None,
) -> tuple[list[Example], list[Example]]:
    """Training examples and a disjoint (by prompt) held-out set.

    Generated sources draw the held-out set from a separate seed stream (`derive_seed(seed, "eval/<round>")`)
    and drop prompts that occur in training, drawing more rounds (doubling) until `eval_size` is reached; a
    JSONL file is split with `split_train_eval`, and then the training part is cut to `size` (0 = all).
    """
    if source == "jsonl":
        everything = make_examples(source, name=name, path=path, size=0, seed=seed, params=params)
        file_train, file_held_out = split_train_eval(everything, eval_size, seed)
        return (file_train[:size] if size else file_train), file_held_out
    train = make_examples(source, name=name, path=path, size=size, seed=seed, params=params)
    if eval_size == 0:
        return train, []
    seen = {example.prompt for example in train}
    held_out: list[Example] = []
    draw = max(2 * eval_size, 16)
    for round_index in range(_EVAL_ROUNDS):
        stream_seed = derive_seed(seed, f"eval/{round_index}")
        for example in make_examples(source, name=name, size=draw, seed=stream_seed, params=params):
            if example.prompt not in seen:
                seen.add(example.prompt)
                held_out.append(example)
                if len(held_out) == eval_size:
                    return train, held_out
        draw *= 2
    raise ValueError(
        f"found only {len(held_out)} held-out prompts that are not in the training set "
        f"(wanted {eval_size}); widen the task or lower eval_size"
    )


def _check_size(size: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive integer, got {size!r}")


def _forbid(source: str, **given: Any) -> None:
    for key, value in given.items():
        if value is not None:
            raise ValueError(f"source {source!r} does not take {key!r}")


# --- prompt rendering -------------------------------------------------------------------------------------


def validate_template(template: str) -> None:
    """A prompt template is a str.format string whose only field is {prompt}, which it must contain."""
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ValueError(f"bad prompt template {template!r}: {exc}") from exc
    if "prompt" not in fields:
        raise ValueError(f"prompt template {template!r} must contain {{prompt}}")
    extra = sorted(fields - {"prompt"})
    if extra:
        raise ValueError(
            f"prompt template {template!r} has unknown field(s) {extra}; only {{prompt}} is allowed "
            "(write literal braces as {{ and }})"
        )


def render_prompt(
    example: Example,
    template: str | None = None,
    tokenizer: Any = None,
    *,
    use_chat_template: bool = False,
    system_prompt: str | None = None,
) -> str:
    """The text the model sees: `template` filled with the prompt, then, with `use_chat_template` and a
    tokenizer that has a chat template, wrapped as one user turn with the assistant turn opened.

    A tokenizer without a chat template (tiny-arith) gets the plain text. Chat-rendered text already holds
    the template's special tokens, so tokenise it with add_special_tokens=False.
    """
    template = DEFAULT_TEMPLATE if template is None else template
    validate_template(template)
    text = template.format(prompt=example.prompt)
    if not use_chat_template or tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return text
    messages = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    messages.append({"role": "user", "content": text})
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
