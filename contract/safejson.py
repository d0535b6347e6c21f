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
MAX_VALUES = 100_000  # values in one document (the service's bodies allow fewer: max_json_values)
_INT_LIMIT = 10**MAX_INT_DIGITS

_QUOTED = re.compile(rb'"[^"]*"')  # a string once its escaped backslashes and quotes are gone
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
# A run of balanced groups at most `k` levels deep (any bracket closes any: the parser checks the kinds).
# One pass of `_GROUPS[k].sub` takes k levels off the bottom of every subtree (a node h levels high is
# left h - k high), so max_depth levels are counted in max_depth // 8 + max_depth % 8 passes.
_GROUPS: dict[int, re.Pattern[bytes]] = {}
for _k in (1, 8):
    _group = rb"[\[{][\]}]"
    for _ in range(_k - 1):
        _group = rb"[\[{](?:" + _group + rb")*[\]}]"
    _GROUPS[_k] = re.compile(rb"(?:" + _group + rb")+")
# Candidates for a problem, looked for in C over the whole text; a document without any is parsed without
# hooks and not walked. In the text with escaped backslashes and quotes removed: a NUL escape, a high
# surrogate escape not followed by a low one, a low one not after a high one; in the raw bytes: a
# surrogate's own UTF-8 bytes.
_SURROGATE_PAIR = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_BYTES = re.compile(rb"\xed[\xa0-\xbf]")
# Outside strings: NaN and infinities, an exponent of three digits (a float that may overflow to infinity);
# a digit run past MAX_INT_DIGITS (an integer too large, or a float long enough to overflow).
_NUMBER_CANDIDATE = re.compile(rb"NaN|Infinity|[eE][+-]?0*[1-9]\d{2}")
_LONG_DIGITS = re.compile(rb"(?<!\d)\d{%d}" % (MAX_INT_DIGITS + 1))


@dataclass(frozen=True)
class Problem:
    # nul_character | invalid_unicode | non_finite_number | integer_too_large | too_deep | too_many_values
    code: str
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


def loads(data: str | bytes, *, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES) -> Any:
    """json.loads under the rules above; raises UnsafeDocument (a ValueError) or json.JSONDecodeError.

    Linear in the document's size, and in C for all but a document that breaks a rule (issue 44, R3): the
    strings are cut out of a copy with bytes.replace and one regular expression, so the number of values,
    the nesting and the candidates for a problem are counted and searched outside strings without a visit
    per node. One with more than `max_values` values (strings, keys included, or commas and opening
    brackets outside strings, plus one) is refused first, before anything else is measured; one without a
    candidate is parsed without hooks and not walked; the walk that names the place of a problem visits at
    most max_values nodes."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")  # every quote left opens or closes one
    strings = unescaped.count(b'"') // 2
    outside = _QUOTED.sub(b'""', unescaped) if strings <= max_values else b""
    values = max(strings, outside.count(b",") + outside.count(b"[") + outside.count(b"{") + 1)
    if values > max_values:  # refused before anything costs more than a pass over the text
        raise UnsafeDocument(Problem("too_many_values", f"more than {max_values} values in one document"))
    long_digits = _LONG_DIGITS.search(outside) is not None
    suspect = (
        long_digits
        or _deeper_than(outside, max_depth)
        or b"\\u0000" in unescaped
        or _lone_surrogate(unescaped)
        or _SURROGATE_BYTES.search(raw) is not None
        or _NUMBER_CANDIDATE.search(outside) is not None
    )
    return _checked(data, max_depth, long_digits=long_digits) if suspect else json.loads(data)


def _lone_surrogate(unescaped: bytes) -> bool:
    """Whether a surrogate escape is not half of a pair (a high one, then a low one): the pairs cut out in
    C, is any surrogate escape left?"""
    if _SURROGATE_ESCAPE.search(unescaped) is None:
        return False
    return _SURROGATE_ESCAPE.search(_SURROGATE_PAIR.sub(b"", unescaped)) is not None


def _checked(data: str | bytes, max_depth: int, *, long_digits: bool = True) -> Any:
    """The slow path, for a document a candidate says may break a rule: parsed (integers past
    MAX_INT_DIGITS left unconverted, when `long_digits` says there may be one), then walked for the first
    problem (at most max_values nodes; an infinite float is found there)."""

    def parse_int(text: str) -> int | _Refused:
        return int(text) if len(text) <= MAX_INT_DIGITS else _parse_int(text)

    try:
        value = json.loads(data, parse_int=parse_int if long_digits else None, parse_constant=_parse_constant)
    except RecursionError:
        raise UnsafeDocument(Problem("too_deep", f"nested deeper than {max_depth} levels")) from None
    problem = find_unsafe(value, max_depth=max_depth)
    if problem is not None:
        raise UnsafeDocument(problem)
    return value


def _deeper_than(outside: bytes, max_depth: int) -> bool:
    """Whether a text without strings (`outside`) nests more than max_depth levels, without visiting its
    nodes: keep only the brackets, then take levels off the bottom, eight per pass (each pass in C)."""
    if outside.count(b"[") + outside.count(b"{") <= max_depth:
        return False
    brackets = _NOT_BRACKET.sub(b"", outside)
    for k in [8] * (max_depth // 8) + [1] * (max_depth % 8):
        brackets = _GROUPS[k].sub(b"", brackets)
        if not brackets:
            return False
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
    """The first problem in a parsed document (depth first, in document order), or None. One pass; the
    path is kept as one list pushed and popped as the walk goes, and made a tuple only for a problem."""
    path: list[str | int] = []
    problem = _node_problem(value, path)
    if problem is not None or not isinstance(value, dict | list | tuple):
        return problem
    # the open containers: (their items, how many of them were visited), one per level of `path`
    stack: list[tuple[list[tuple[str | int, Any]], int]] = [(_items(value), 0)]
    if max_depth <= 0:
        return Problem("too_deep", f"nested deeper than {max_depth} levels", ())
    while stack:
        items, done = stack[-1]
        if done == len(items):
            stack.pop()
            if path:
                path.pop()
            continue
        stack[-1] = (items, done + 1)
        key, child = items[done]
        path.append(key)
        if isinstance(key, str):
            problem = _string_problem(key, tuple(path), "the key")
            if problem is not None:
                return problem
        problem = _node_problem(child, path)
        if problem is not None:
            return problem
        if isinstance(child, dict | list | tuple):
            if len(stack) >= max_depth:
                return Problem("too_deep", f"nested deeper than {max_depth} levels", tuple(path))
            stack.append((_items(child), 0))
        else:
            path.pop()
    return None


def _items(node: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> list[tuple[str | int, Any]]:
    if isinstance(node, dict):
        return [(str(key), child) for key, child in node.items()]
    return list(enumerate(node))


def _node_problem(node: Any, path: list[str | int]) -> Problem | None:
    if isinstance(node, str):
        return _string_problem(node, tuple(path), "the value")
    if isinstance(node, _Refused):
        return Problem(node.code, node.message, tuple(path))
    if isinstance(node, float) and not math.isfinite(node):
        return Problem("non_finite_number", f"number {node} is not finite", tuple(path))
    if isinstance(node, int) and not isinstance(node, bool) and abs(node) >= _INT_LIMIT:
        digits = int(abs(node).bit_length() * math.log10(2)) + 1
        return Problem(
            "integer_too_large", f"integer of {digits} digits (at most {MAX_INT_DIGITS})", tuple(path)
        )
    return None
