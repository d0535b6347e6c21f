"""Verifiers: a fixed registry of answer checkers, each `score(completion, example, **params) -> float` in [0, 1].

Users pick a verifier by name and set its parameters; they cannot upload reward code. Every spec describes
itself as JSON (`VerifierSpec.to_dict`) for GET /v1/verifiers, and `score` is what POST /v1/verifiers/test and
the training loop call.

- exact: the extracted answer equals the reference after stripping whitespace (case-insensitive by default).
- numeric: the \\boxed{} content, else the last number, equals the reference within rel_tol / abs_tol.
- math_verify: HF Math-Verify equivalence (sympy) of the \\boxed{} content, else the last number.
- reasoning_gym: the task's own score_answer on the entry our generator rebuilds from
  Example.meta["reasoning_gym"] = {task, config, seed, size, index} (trainer/tasks/rg_safety.py); a meta holding an
  entry, and the tasks whose scorers evaluate the answer as code (rg_safety.REFUSED_SCORERS), are refused.

A completion is first cut at the first end-of-text marker (`STOP_MARKERS`) in case it was decoded with
special tokens. A verifier raises VerifierError (a ValueError) when the *example* cannot be scored (a reference
that is not a number, a missing reasoning-gym entry): that is a dataset/verifier mismatch, a user error, and
not a reward of 0.

Bounding math_verify: its parse/verify time out with signal.alarm, which only works in the main thread and
would clobber any other SIGALRM user (pytest-timeout, a supervisor), so we call them with the timeouts off
and bound the work ourselves: the extracted prediction is capped at `max_chars` characters (longer scores 0),
and both parsed expressions must pass `_bounded_expression`: at most 200 sympy nodes; constant exponents up
to 1000 on a constant base and 24 on a symbolic one (verify on 9^{9^{9^9}} ran for minutes until killed,
(x+1)^{999}(x-1)^{999} ran past 30 s); constants up to 1000 inside functions, sums, products, integrals and
limits (binomial(10^900, 10^800) and a product up to 10^9 ran past 30 s). Magnitudes are bounded through
+, × and ^ without evaluating anything. These are heuristics tested against the inputs above, not a proof;
inside them parse + verify took under 0.5 s on every input we tried.

This module imports neither torch nor transformers; math_verify and reasoning_gym are imported on first use.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from contract.verifiers import (
    EXTRACT_MODES,
    REWARD_STYLES,
    VERIFIER_PARAMS,
    ParamSpec,
    VerifierParams,
    get_params,
    validate_params,
)
from trainer.tasks import rg_safety
from trainer.tasks.sources import REASONING_GYM_META_KEY, Example

__all__ = [
    "REWARD_STYLES",
    "STOP_MARKERS",
    "VERIFIERS",
    "ParamSpec",
    "VerifierError",
    "VerifierSpec",
    "extract_answer",
    "get_verifier",
    "score",
    "shape_reward",
    "validate_params",
]

STOP_MARKERS = ("<eos>", "<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>")


class VerifierError(ValueError):
    """The example (not the completion) cannot be scored by this verifier."""


@dataclass(frozen=True)
class VerifierSpec(VerifierParams):
    """A declared verifier (contract.verifiers) with its scoring function."""

    fn: Callable[..., float]


# --- extraction -------------------------------------------------------------------------------------------

# A number: optional sign (only where it cannot be a binary minus, i.e. not right after a digit, letter or
# closing bracket), digits with optional thousands commas, optional decimals and exponent; or a fraction a/b.
_NUMBER = (
    r"(?:(?<![\w)\]}.])[-+−])?"  # sign
    r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)"  # 1,234.5 | 1234.5 | .5
    r"(?:[eE][-+]?\d+)?"  # exponent
)
_LATEX_FRACTION_RE = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_NUMBER_OR_FRACTION_RE = re.compile(rf"({_NUMBER})(?:\s*/\s*({_NUMBER}))?")
_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_BOXED_OPENERS = ("\\boxed{", "\\fbox{")


def strip_stop_markers(completion: str) -> str:
    cut = len(completion)
    for marker in STOP_MARKERS:
        found = completion.find(marker)
        if found != -1:
            cut = min(cut, found)
    return completion[:cut]


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), with nested braces balanced; None if there is none."""
    start = max(text.rfind(opener) for opener in _BOXED_OPENERS)
    if start == -1:
        return None
    begin = text.index("{", start) + 1
    depth = 1
    for position in range(begin, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:position]
    return None  # unbalanced: the box never closed


def last_number_text(text: str) -> str | None:
    matches = list(_NUMBER_OR_FRACTION_RE.finditer(text))
    return matches[-1].group(0) if matches else None


def parse_number(text: str) -> float | None:
    """A float from "1,234", "-3.5", "2e3", "3/4" (surrounding spaces and $ ignored); None if it is not one."""
    text = text.strip().strip("$").strip()
    match = _NUMBER_OR_FRACTION_RE.fullmatch(text)
    if match is None:
        return None
    try:  # a 5000-digit number passes the pattern but not int() (4300 digits), a huge ratio not float()
        numerator, denominator = (
            _to_fraction(match.group(1)),
            _to_fraction(match.group(2)) if match.group(2) else Fraction(1),
        )
        if denominator == 0:
            return None
        return float(numerator / denominator)
    except (ValueError, OverflowError):
        return None


_MAX_DECIMAL_EXPONENT = 400  # past float's range either way; Fraction("1e999999999") builds 10**999999999
_EXPONENT_RE = re.compile(r"[eE]([-+]?\d+)$")


def _to_fraction(text: str) -> Fraction:
    text = text.replace(",", "").replace("−", "-")
    exponent = _EXPONENT_RE.search(text)
    if exponent is not None and abs(int(exponent.group(1))) > _MAX_DECIMAL_EXPONENT:
        raise OverflowError(f"exponent of {text[:20]!r} is out of range")
    return Fraction(text)


def extract_answer(completion: str, mode: str) -> str | None:
    """The answer part of a completion (None when the mode finds nothing), before any comparison."""
    text = strip_stop_markers(completion)
    if mode == "full":
        return text
    if mode == "first_line":
        return next((line for line in text.splitlines() if line.strip()), "")
    if mode == "boxed":
        return last_boxed(text)
    if mode == "last_number":
        return last_number_text(text)
    if mode == "answer_tag":
        tags = _ANSWER_TAG_RE.findall(text)
        return tags[-1] if tags else None
    raise ValueError(f"unknown extract mode {mode!r}; valid: {', '.join(EXTRACT_MODES)}")


# --- the verifiers ----------------------------------------------------------------------------------------


def _exact(completion: str, example: Example, *, extract: str, case_sensitive: bool) -> float:
    predicted = extract_answer(completion, extract)
    if predicted is None:
        return 0.0
    predicted, reference = predicted.strip(), example.answer.strip()
    if not case_sensitive:
        predicted, reference = predicted.casefold(), reference.casefold()
    return float(predicted == reference)


def _numeric(completion: str, example: Example, *, rel_tol: float, abs_tol: float) -> float:
    reference = parse_number(example.answer)
    if reference is None:
        raise VerifierError(f"the numeric verifier needs a numeric reference answer, got {example.answer!r}")
    text = strip_stop_markers(completion)
    boxed = last_boxed(text)
    # \frac{3}{4} → 3/4, so that the fraction and not its denominator is the last number.
    candidate = last_number_text(_LATEX_FRACTION_RE.sub(r"\1/\2", boxed if boxed is not None else text))
    predicted = parse_number(candidate) if candidate is not None else None
    if predicted is None:
        return 0.0
    return float(math.isclose(predicted, reference, rel_tol=rel_tol, abs_tol=abs_tol))


_MAX_SYMPY_NODES = 200
_MAX_EXPONENT = 1000  # on a constant base
_MAX_SYMBOLIC_EXPONENT = 24
_MAX_FUNCTION_LOG10 = 3.0  # numbers inside functions up to ~1000


@functools.cache
def _plain_sympy_types() -> tuple[type, ...]:
    import sympy
    from sympy.core.relational import Relational

    return (sympy.Add, sympy.Mul, sympy.Pow, sympy.Atom, sympy.Tuple, sympy.Set, Relational, sympy.MatrixBase)


def _bounded_expression(value: Any) -> bool:
    """True when sympy can compare `value` in bounded time (see the module docstring)."""
    import sympy

    if not isinstance(value, sympy.Basic):
        return True  # strings (fallback matches) compare as text
    plain = _plain_sympy_types()
    for count, node in enumerate(sympy.preorder_traversal(value), start=1):
        if count > _MAX_SYMPY_NODES:
            return False
        if isinstance(node, sympy.Pow):
            # A constant exponent is bounded (9^{9^{9^9}} has one of ~10^(3.7*10^8)); a symbolic base gets
            # expanded, so its bound is lower: (x+1)^{1000} took 6 s, (x+1)^{999}(x-1)^{999} ran past 30 s.
            limit = _MAX_EXPONENT if node.base.is_number else _MAX_SYMBOLIC_EXPONENT
            if node.exp.is_number and _log10_bound(node.exp) > math.log10(limit):
                return False
        elif not isinstance(node, plain):
            # Functions, sums, products, integrals, limits stay unevaluated at parse time and verify then
            # evaluates them: binomial(10^900, 10^800) and a product up to 10^9 hung, sin(10^1000) took 0.4 s.
            for part in sympy.preorder_traversal(node):
                if part.is_number and _log10_bound(part) > _MAX_FUNCTION_LOG10:
                    return False
    return True


def _log10_bound(expr: Any) -> float:
    """A rough upper bound on log10 |expr| for a constant sympy expression, without evaluating it."""
    import sympy

    if isinstance(expr, sympy.Rational):
        return math.log10(abs(expr.p)) if expr.p else 0.0  # exact for big ints; ignoring q only raises it
    if isinstance(expr, sympy.Float):
        return math.log10(abs(float(expr))) if expr != 0 else 0.0
    if isinstance(expr, sympy.Pow):
        if not expr.exp.is_Number:
            return math.inf
        return max(_log10_bound(expr.base), 0.0) * abs(float(expr.exp))
    if isinstance(expr, sympy.Mul):
        return sum(max(_log10_bound(arg), 0.0) for arg in expr.args)
    if isinstance(expr, sympy.Add):
        return max(_log10_bound(arg) for arg in expr.args) + math.log10(len(expr.args))
    if not expr.args:
        return 1.0  # pi, E, I
    return max(_log10_bound(arg) for arg in expr.args)


class _DropTimeoutWarning(logging.Filter):
    # We turn math_verify's signal timeouts off on purpose and bound the work ourselves.
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


@functools.cache
def _math_verify() -> Any:
    import math_verify

    for logger_name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(logger_name).addFilter(_DropTimeoutWarning())
    return math_verify


def _math_parse(text: str) -> list[Any]:
    return list(_math_verify().parse(f"${text}$", parsing_timeout=None))


def _math_verify_score(completion: str, example: Example, *, max_chars: int) -> float:
    if len(example.answer) > max_chars:
        raise VerifierError(f"reference answer longer than max_chars={max_chars}")
    gold = _math_parse(example.answer.strip().strip("$"))
    if not gold:
        raise VerifierError(f"math_verify cannot parse the reference answer {example.answer!r}")
    if not all(_bounded_expression(value) for value in gold):
        raise VerifierError(f"reference answer {example.answer!r} is too large to compare in bounded time")
    text = strip_stop_markers(completion)
    predicted_text = last_boxed(text)
    if predicted_text is None:
        predicted_text = last_number_text(text)
    if predicted_text is None or not predicted_text.strip() or len(predicted_text) > max_chars:
        return 0.0
    predicted = _math_parse(predicted_text)
    if not predicted or not all(_bounded_expression(value) for value in predicted):
        return 0.0
    return float(_math_verify().verify(gold, predicted, timeout_seconds=None))


def _reasoning_gym(completion: str, example: Example, *, extract: str) -> float:
    info = example.meta.get(REASONING_GYM_META_KEY)
    if info is None:
        raise VerifierError(
            "the reasoning_gym verifier needs example.meta['reasoning_gym'] = {'task', 'config', 'seed', "
            "'size', 'index'}, which reasoning-gym task sources provide; this example has none (a JSONL file "
            "must carry it in each line's 'meta')"
        )
    try:  # never the tenant's entry, never a scorer that evaluates the answer
        meta = rg_safety.check_meta(info)
        dataset, entry = rg_safety.rebuild_entry(meta)
    except ValueError as exc:
        raise VerifierError(str(exc)) from exc
    if extract == "auto":
        text = strip_stop_markers(completion)
        predicted = extract_answer(text, "answer_tag")
        if predicted is None:
            predicted = last_boxed(text)
        if predicted is None:
            predicted = extract_answer(text, "first_line")
    else:
        predicted = extract_answer(completion, extract)
    if predicted is None:
        return 0.0
    try:
        return float(dataset.score_answer(predicted.strip(), entry))
    except Exception:  # the task's scorer failing on a completion (deep nesting: RecursionError) scores 0
        return 0.0


_SCORERS: dict[str, Callable[..., float]] = {
    "exact": _exact,
    "numeric": _numeric,
    "math_verify": _math_verify_score,
    "reasoning_gym": _reasoning_gym,
}
VERIFIERS: dict[str, VerifierSpec] = {
    name: VerifierSpec(declared.name, declared.description, declared.params, _SCORERS[name])
    for name, declared in VERIFIER_PARAMS.items()
}


# --- registry API -----------------------------------------------------------------------------------------


def get_verifier(name: str) -> VerifierSpec:
    get_params(name)  # an unknown name fails listing the valid ones
    return VERIFIERS[name]


def score(name: str, completion: str, example: Example, params: Mapping[str, Any] | None = None) -> float:
    """Score one completion in [0, 1]. Raises ValueError for a bad name/params, VerifierError for an example
    this verifier cannot score."""
    resolved = validate_params(name, params)
    value = float(get_verifier(name).fn(completion, example, **resolved))
    if math.isnan(value):
        return 0.0
    return min(1.0, max(0.0, value))


def shape_reward(correct: float, style: str = "binary") -> float:
    """Reward from a verifier score in [0, 1]: "binary" keeps it (1 / 0 for a right / wrong answer); "pm1"
    maps it linearly to [-1, 1] (+1 / -1). Partial credit (reasoning-gym) maps linearly in both."""
    if not 0.0 <= correct <= 1.0:
        raise ValueError(f"verifier score must be in [0, 1], got {correct!r}")
    if style == "binary":
        return float(correct)
    if style == "pm1":
        return 2.0 * float(correct) - 1.0
    raise ValueError(f"unknown reward style {style!r}; valid: {', '.join(REWARD_STYLES)}")
