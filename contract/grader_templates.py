"""Grader templates: `{{sample.output_text}}`, `{{sample.output_json}}` (and `.key` into it) and
`{{item.<field>}}` (and `.key` into it), inside a string_check's or text_similarity's `input` and `reference`.

A sample is what the model wrote: `output_text` (the completion, cut at the first end-of-text marker) and
`output_json` (the completion parsed as JSON when it parses, else null). An item is the dataset row: its
`prompt`, its `answer` and the fields of its `meta` object (a meta field named prompt or answer is
shadowed by the row's own). A template names a path; `check` refuses any other (at spec time), `render`
fills it in (at grading time): a string as it is, any other value as compact JSON, a path that the sample
or the item does not have is a TemplateError (a grader error, never an empty string).
Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# {{ path }} with optional spaces; a path is dotted identifiers (letters, digits, _ and -).
_PLACEHOLDER = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*")
MAX_TEMPLATE_CHARS = 20_000
MAX_RENDERED_CHARS = 1_000_000  # a rendered input or reference (a completion is at most about this long)


class TemplateError(ValueError):
    """A template that names nothing a sample or an item has, or a value it cannot be filled with."""


def paths(template: str) -> list[tuple[str, ...]]:
    """The paths a template names, each split at its dots."""
    return [tuple(match.group(1).split(".")) for match in _PLACEHOLDER.finditer(template)]


def check(template: object) -> str:
    """The template, or TemplateError naming the placeholder that is not sample.output_text,
    sample.output_json[.key...] or item.<field>[.key...]."""
    if not isinstance(template, str):
        raise TemplateError(f"must be a string, got {type(template).__name__}")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"is {len(template)} characters long; at most {MAX_TEMPLATE_CHARS}")
    for match in _PLACEHOLDER.finditer(template):
        path = match.group(1)
        if not _PATH.fullmatch(path):
            raise TemplateError(f"{match.group(0)!r} is not a template path")
        parts = path.split(".")
        if parts[0] == "sample":
            if len(parts) < 2 or parts[1] not in ("output_text", "output_json"):
                raise TemplateError(
                    f"{match.group(0)!r}: a sample has output_text and output_json (sample.output_text)"
                )
            if parts[1] == "output_text" and len(parts) > 2:
                raise TemplateError(f"{match.group(0)!r}: output_text is a string, it has no fields")
        elif parts[0] == "item":
            if len(parts) < 2:
                raise TemplateError(f"{match.group(0)!r}: name the item's field (item.answer)")
        else:
            raise TemplateError(f"{match.group(0)!r}: a template reads sample.* or item.*")
    return template


def parse_output_json(text: str) -> Any:
    """The completion as JSON, or None when it is not JSON (or too deep or too large a number to read)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def item_of(prompt: str, answer: str, meta: Mapping[str, Any] | None) -> dict[str, Any]:
    """A dataset row as graders see it: its meta's fields, then prompt and answer."""
    return {**dict(meta or {}), "prompt": prompt, "answer": answer}


def sample_of(output_text: str) -> dict[str, Any]:
    return {"output_text": output_text, "output_json": parse_output_json(output_text)}


def _lookup(root: Mapping[str, Any], parts: tuple[str, ...]) -> Any:
    """The value at parts[1:] under root (parts[0] names the root: sample or item)."""
    value: Any = root
    for depth in range(1, len(parts)):
        key = parts[depth]
        if isinstance(value, Mapping) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            what = "null" if value is None else type(value).__name__
            raise TemplateError(f"{'.'.join(parts)}: {'.'.join(parts[:depth])} ({what}) has no field {key!r}")
    return value


def _text(value: Any, path: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as err:
        raise TemplateError(f"{path}: cannot be written as text: {err}") from None


def render(template: str, sample: Mapping[str, Any], item: Mapping[str, Any]) -> str:
    """The template with its placeholders filled from the sample and the item."""
    roots = {"sample": sample, "item": item}

    def fill(match: re.Match[str]) -> str:
        parts = tuple(match.group(1).split("."))
        if parts[0] not in roots:
            raise TemplateError(f"{match.group(0)!r}: a template reads sample.* or item.*")
        return _text(_lookup(roots[parts[0]], parts), match.group(1))

    rendered = _PLACEHOLDER.sub(fill, template)
    if len(rendered) > MAX_RENDERED_CHARS:
        raise TemplateError(f"renders to {len(rendered)} characters; at most {MAX_RENDERED_CHARS}")
    return rendered
