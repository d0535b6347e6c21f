"""Every problem of a job spec at once, each at its exact field, in plain words, with "did you mean".

pydantic reports a spec's errors as (location, type, message) triples written for programmers
("Extra inputs are not permitted", "Value error, ..."). `spec_problems` turns each into a SpecProblem: the
dotted path of the field inside the spec (`optim.learning_rate`, `algorithm.params.clip_high`), a sentence
without the library's prefixes that says what to write instead, a stable code, and for an unknown field or
name the valid one it most likely stands for (contract.suggest).

A check written as a validator on a section (`evaluation.k must be 1 when ...`) is raised at the
section's location; its message starts with the field it is about, and that field is what is reported. A
check across sections (TrainSpec's own `_cross_field`) runs only once every section is valid, so it comes
back on the next try, never with the others.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from contract.suggest import nearest

__all__ = [
    "SpecProblem",
    "fields_of",
    "in_field_order",
    "plain_words",
    "spec_problems",
    "unknown_name_problems",
]

# codes of SpecProblem
UNKNOWN_FIELD = "unknown_field"
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
OUT_OF_RANGE = "out_of_range"
INVALID_VALUE = "invalid_value"


@dataclass(frozen=True)
class SpecProblem:
    field: str  # dotted path inside the spec; "" for the spec as a whole
    message: str  # plain words, with the fix where one is known
    code: str  # unknown_field | missing_field | wrong_type | out_of_range | invalid_value
    suggestion: str | None = None  # the valid name meant, for an unknown field or value
    error_code: str = "invalid_spec"  # the API's error code when this is the request's only problem

    def detail(self, prefix: str = "spec") -> dict[str, Any]:
        """The entry of an error's `details`: field (in the spec), param (in the request), message, code,
        suggestion."""
        param = f"{prefix}.{self.field}" if self.field else prefix
        return {
            "field": self.field or prefix,
            "param": param,
            "message": self.message,
            "code": self.code,
            "suggestion": self.suggestion,
        }


_TYPE_WORDS = {
    "int": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "string": "a string",
    "str": "a string",
    "dict": "a mapping of fields",
    "model": "a mapping of fields",
    "model_attributes": "a mapping of fields",
    "list": "a list",
    "tuple": "a list",
}
_BOUNDS = {
    "greater_than_equal": ("≥", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("≤", "le"),
    "less_than": ("<", "lt"),
}
_LIBRARY_PREFIXES = ("Value error, ", "Assertion failed, ")
_LEADING_FIELD = re.compile(r"([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)*)(: |\s)")
_UNKNOWN_NAME = re.compile(r"^unknown ([\w -]+?) '([^']*)'(.*?)(?:; valid: (.*))?$")
_UNKNOWN_PARAMS = re.compile(r"^unknown parameter\(s\) for loss '([^']*)': ([\w, ]+); valid: (.*)$")
_NO_PARAMS = re.compile(r"^verifier '([^']*)' has no param\(s\) \[(.*)\]; valid: (.*)$")


def spec_problems(err: ValidationError, model: type[BaseModel]) -> list[SpecProblem]:
    """The problems of one validation of `model` (TrainSpec), in the order of its fields."""
    found: list[SpecProblem] = []
    for item in err.errors(include_url=False):
        found.extend(_problems_of(dict(item), model))
    return in_field_order(found, model)


def in_field_order(problems: Iterable[SpecProblem], model: type[BaseModel]) -> list[SpecProblem]:
    """The problems in the order of `model`'s sections (the spec as written top to bottom); stable within a
    section."""
    order = {name: i for i, name in enumerate(model.model_fields)}
    return sorted(problems, key=lambda p: order.get(p.field.split(".")[0].split("[")[0], -1))


def fields_of(model: type[BaseModel], path: Iterable[Any]) -> list[str] | None:
    """The field names of the section at `path` inside `model` (None where no single model is there: a
    free-form map such as task.params, a union, a list item, a base class such as algorithm.control's
    whose subclass the data picks)."""
    current: type[BaseModel] | None = model
    for part in path:
        if current is None or not isinstance(part, str) or part not in current.model_fields:
            return None
        current = _one_model(current.model_fields[part].annotation)
    if current is None or current.__subclasses__():  # a base whose subclass is chosen by the data
        return None
    return list(current.model_fields)


def unknown_name_problems(field: str, text: str) -> list[SpecProblem] | None:
    """Problems of a message in the house form "unknown <kind> '<name>'; valid: a, b" (and the loss's and
    verifier's parameter lists), one per unknown name, each with its suggestion; None for any other text."""
    if match := _UNKNOWN_PARAMS.match(text):
        loss, names, valid = match.groups()
        base = field if field.endswith("params") else f"{field}.params"
        return [
            _unknown(f"{base}.{name}", f"unknown parameter of loss {loss!r}", name, valid.split(", "))
            for name in names.split(", ")
        ]
    if match := _NO_PARAMS.match(text):
        verifier, names, valid = match.groups()
        base = field if field.endswith("params") else f"{field}.params"
        unknown = re.findall(r"'([^']*)'", names)
        return [
            _unknown(
                f"{base}.{name}", f"verifier {verifier!r} has no param {name!r}", name, valid.split(", ")
            )
            for name in unknown
        ]
    if match := _UNKNOWN_NAME.match(text):
        kind, name, rest, valid = match.groups()
        names = valid.split(", ") if valid else []
        suggestion = nearest(name, names)
        message = f"unknown {kind} {name!r}{rest}"
        message += f"; did you mean `{suggestion}`?" if suggestion is not None else ""
        message += f" (valid: {valid})" if valid else ""
        return [SpecProblem(field, message, INVALID_VALUE, suggestion)]
    return None


def _unknown(field: str, message: str, name: str, valid: list[str]) -> SpecProblem:
    suggestion = nearest(name, valid)
    hint = f"; did you mean `{suggestion}`?" if suggestion else ""
    return SpecProblem(field, f"{message}{hint} (valid: {', '.join(valid)})", UNKNOWN_FIELD, suggestion)


def _problems_of(item: dict[str, Any], model: type[BaseModel]) -> list[SpecProblem]:
    loc = [part for part in item.get("loc", ()) if not (isinstance(part, str) and "[" in part)]
    field = dotted(loc)
    kind = str(item.get("type", ""))
    value = item.get("input")
    ctx: Mapping[str, Any] = item.get("ctx") or {}
    if kind == "extra_forbidden":
        valid = fields_of(model, loc[:-1]) or []
        suggestion = nearest(str(loc[-1]), valid) if loc else None
        hint = (
            f"did you mean `{suggestion}`?" if suggestion else f"valid: {', '.join(valid)}" if valid else ""
        )
        return [
            SpecProblem(field, "unknown field" + (f"; {hint}" if hint else ""), UNKNOWN_FIELD, suggestion)
        ]
    if kind == "missing":
        return [SpecProblem(field, "required: this field has no default", MISSING_FIELD)]
    if kind in ("literal_error", "enum"):
        valid = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        suggestion = nearest(str(value), valid)
        hint = f"; did you mean `{suggestion}`?" if suggestion else ""
        message = f"{_shown(value)} is not one of {', '.join(valid)}{hint}"
        return [SpecProblem(field, message, INVALID_VALUE, suggestion)]
    if kind in _BOUNDS:
        sign, key = _BOUNDS[kind]
        return [SpecProblem(field, f"must be {sign} {ctx.get(key)}, not {_shown(value)}", OUT_OF_RANGE)]
    if kind == "value_error" or kind == "assertion_error":
        return _value_problems(field, str(ctx.get("error") or item.get("msg", "")), model)
    if (words := _type_words(kind)) is not None:
        return [SpecProblem(field, f"must be {words}, not {_shown(value)}", WRONG_TYPE)]
    message = plain_words(str(item.get("msg", "invalid value")))
    return [SpecProblem(field, message, INVALID_VALUE)]


def _value_problems(field: str, text: str, model: type[BaseModel]) -> list[SpecProblem]:
    """A validator's message: the field it names first (when inside the failing section), without the
    library's prefix; an unknown name with its suggestion."""
    text = plain_words(text)
    match = _LEADING_FIELD.match(text)
    if match and match.group(1).split(".")[0] in model.model_fields:
        named = match.group(1)
        if not field or named == field or named.startswith(field + "."):
            field = named
            if match.group(2) == ": ":
                text = text[match.end() :]
    found = unknown_name_problems(field, text)
    if found is not None:
        if len(found) == 1 and "name" in (fields_of(model, found[0].field.split(".")) or ()):
            found = [dataclasses.replace(found[0], field=f"{found[0].field}.name")]
        return found
    return [SpecProblem(field, text, INVALID_VALUE)]


def plain_words(text: str) -> str:
    """A pydantic message without its prefix ("Value error, ") and with "must be" for "Input should be"."""
    for prefix in _LIBRARY_PREFIXES:
        text = text.removeprefix(prefix)
    return text.replace("Input should be", "must be")


def _type_words(kind: str) -> str | None:
    for suffix in ("_parsing", "_type", "_from_float"):
        if kind.endswith(suffix) and kind.removesuffix(suffix) in _TYPE_WORDS:
            words = _TYPE_WORDS[kind.removesuffix(suffix)]
            return words if suffix != "_from_float" else "a whole number"
    return None


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def dotted(loc: Iterable[Any]) -> str:
    """A pydantic error location as a field path: ('optim', 'lr') → 'optim.lr', ('rows', 3) → 'rows[3]'."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int) and parts:
            parts[-1] += f"[{part}]"
        else:
            parts.append(str(part))
    return ".".join(parts)


def _one_model(annotation: Any) -> type[BaseModel] | None:
    """The one pydantic model an annotation holds (through Optional and Annotated); None for none or a
    union of several."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    found = {m for arg in typing.get_args(annotation) if (m := _one_model(arg)) is not None}
    return found.pop() if len(found) == 1 else None
