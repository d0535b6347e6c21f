"""One rule for every document that crosses a boundary: JSON request bodies, JSONL task lines, YAML specs.

A document is refused, with the place named, when it holds
- a NUL character in any string or key (PostgreSQL text cannot store one; nothing of ours needs one),
- a lone surrogate (`"\\ud800"`): not encodable as UTF-8, so it could not be stored or written either,
- a non-finite number (`NaN`, `Infinity`, or a literal such as `1e999` that overflows to infinity),
- an integer of more than MAX_INT_DIGITS digits (Python refuses to convert past 4,300 digits anyway, and no
  field of ours needs more than 19),
- nesting deeper than MAX_DEPTH arrays and objects.

`loads` parses JSON under these rules and raises `UnsafeDocument`; `find_unsafe` checks a value already
parsed (a YAML spec, say). Both walk iteratively, so no document can exhaust the stack. The service applies
`loads` to every JSON body (service.boundary) and the JSONL checker to every line; the trainer applies
`find_unsafe` to the spec files it loads. Torch-free.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 32
MAX_INT_DIGITS = 64
_INT_LIMIT = 10**MAX_INT_DIGITS

# Escapes whose presence makes a full walk necessary: \u0000 (NUL) and \ud800-\udfff (surrogates).
_WALK_TRIGGERS = (b"\\u0000", b"\\ud", b"\\uD")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_INNERMOST_PAIR = re.compile(rb"\[\]|\{\}")


@dataclass(frozen=True)
class Problem:
    code: str  # nul_character | invalid_unicode | non_finite_number | integer_too_large | too_deep
    message: str
    path: tuple[str | int, ...] = ()

    @property
    def where(self) -> str:
        return dotted(self.path)


class UnsafeDocument(ValueError):
    def __init__(self, problem: Problem) -> None:
        where = f"{problem.where}: " if problem.path else ""
        super().__init__(f"{where}{problem.message}")
        self.problem = problem


def dotted(path: Sequence[str | int]) -> str:
    """('optim', 'lr') → 'optim.lr'; ('rows', 3, 'x') → 'rows[3].x'."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = part if part.isprintable() else part.encode("unicode_escape", "backslashreplace").decode()
            out += f".{name}" if out else name
    return out


class _Refused:
    """What the parse hooks return in place of a number the rules refuse; the walk reports it."""

    __slots__ = ("code", "message")

    def __init__(self, code: str, message: str) -> None:
        self.code, self.message = code, message


def _parse_int(text: str) -> int | _Refused:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        return _Refused("integer_too_large", f"integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_constant(text: str) -> _Refused:
    return _Refused("non_finite_number", f"{text} is not a number JSON allows")


def loads(data: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """json.loads under the rules above; raises UnsafeDocument (a ValueError) or json.JSONDecodeError."""
    refused: list[_Refused] = []

    def parse_int(text: str) -> int | _Refused:
        if len(text) <= MAX_INT_DIGITS:
            return int(text)
        value = _parse_int(text)
        if isinstance(value, _Refused):
            refused.append(value)
        return value

    def parse_float(text: str) -> float | _Refused:
        value = float(text)
        if math.isfinite(value):
            return value
        refused.append(_Refused("non_finite_number", f"number {text[:40]} is not finite"))
        return refused[-1]

    def parse_constant(text: str) -> _Refused:
        refused.append(_parse_constant(text))
        return refused[-1]

    try:
        value = json.loads(data, parse_int=parse_int, parse_float=parse_float, parse_constant=parse_constant)
    except RecursionError:
        raise UnsafeDocument(Problem("too_deep", f"nested deeper than {max_depth} levels")) from None
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    # The walk costs a visit per node; skip it when nothing can be wrong: no hook fired, no escape that
    # makes a NUL or a surrogate, and too few brackets to nest past the limit.
    if refused or any(t in raw for t in _WALK_TRIGGERS) or _deeper_than(raw, max_depth):
        problem = find_unsafe(value, max_depth=max_depth)
        if problem is not None:
            raise UnsafeDocument(problem)
    return value


def _deeper_than(raw: bytes, max_depth: int) -> bool:
    """Whether a valid JSON text nests more than max_depth levels, without visiting its nodes: keep only
    the brackets outside strings, then strip innermost pairs once per allowed level (each pass in C)."""
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return False
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", raw))
    for _ in range(max_depth):
        brackets, n = _INNERMOST_PAIR.subn(b"", brackets)
        if not brackets or n == 0:
            return bool(brackets)
    return bool(brackets)


def _string_problem(text: str, path: tuple[str | int, ...], what: str) -> Problem | None:
    if "\x00" in text:
        return Problem("nul_character", f"{what} contains a NUL character", path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return Problem("invalid_unicode", f"{what} contains a lone surrogate (not valid UTF-8)", path)
    return None


def find_unsafe(value: Any, *, max_depth: int = MAX_DEPTH) -> Problem | None:
    """The first problem in a parsed document (depth first, in document order), or None."""
    stack: list[tuple[Any, tuple[str | int, ...], int]] = [(value, (), 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, dict):
            if depth >= max_depth:
                return Problem("too_deep", f"nested deeper than {max_depth} levels", path)
            children = []
            for key, child in node.items():
                key_text = str(key)
                problem = _string_problem(key_text, (*path, key_text), "the key")
                if problem is not None:
                    return problem
                children.append((child, (*path, key_text), depth + 1))
            stack.extend(reversed(children))
        elif isinstance(node, list | tuple):
            if depth >= max_depth:
                return Problem("too_deep", f"nested deeper than {max_depth} levels", path)
            stack.extend(reversed([(child, (*path, i), depth + 1) for i, child in enumerate(node)]))
        elif isinstance(node, str):
            problem = _string_problem(node, path, "the value")
            if problem is not None:
                return problem
        elif isinstance(node, _Refused):
            return Problem(node.code, node.message, path)
        elif isinstance(node, float) and not math.isfinite(node):
            return Problem("non_finite_number", f"number {node} is not finite", path)
        elif isinstance(node, int) and abs(node) >= _INT_LIMIT:
            digits = int(abs(node).bit_length() * math.log10(2)) + 1
            return Problem(
                "integer_too_large", f"integer of {digits} digits (at most {MAX_INT_DIGITS})", path
            )
    return None
