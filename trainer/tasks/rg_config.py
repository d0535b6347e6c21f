"""Reasoning-gym config fields a tenant may set: an allow-list per task, with types and ranges.

A reasoning-gym task is built from a config dataclass (`reasoning_gym.create_dataset(task, **config)`), and
a config field is free to name a file: `spell_backward.data_file` is joined onto the package's data folder
and read, so an absolute path or `..` read any file of the host (issue 44, R1). So no config reaches the
generator as the tenant wrote it: `check_config` checks every field against this allow-list and answers a
`ConfigError` naming the field (`<where>.<field>`) for anything else.

- Numbers and switches (int, Optional[int], float, bool: 515 of the 580 fields of reasoning-gym 0.1.25) are
  allowed by their annotation: an int is an integer (not a bool), a float any finite number, a bool a bool;
  each number within ±max(NUMBER_LIMIT, DEFAULT_SCALE × |its default|). A number names no file.
- Every other field is listed in `RULES`, reviewed one by one: a choice among fixed strings (operators,
  task types, styles, fonts), a list of short words (names, colours, variables), a list of bounded numbers
  (weights, difficulty ranges), or refused (`REFUSED`: a file name, nested task configs, structured
  options, dates). tests/security/test_rg_config.py recomputes the fields of the installed package and
  fails on a field neither numeric nor listed here, so an upgrade that adds one is refused until reviewed.

Messages are ours and stable: they name the field and what it takes, never what the generator or the file
system said. Imports reasoning_gym only when a config is checked.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from contract import safejson

__all__ = ["NUMBER_LIMIT", "REFUSED", "RULES", "ConfigError", "check_config", "field_kinds", "task_names"]

NUMBER_LIMIT = 10**6  # a number field's bound when its default is small
DEFAULT_SCALE = 100  # ... else this many times its default
MAX_ITEMS = 64  # a list field's length, unless its rule says otherwise
RESERVED = ("size", "seed")  # set by the server (the meta's size and seed), never in a config


class ConfigError(ValueError):
    """A config field we do not accept; `field` names it (dotted), `code` is invalid_config or
    forbidden_field (a field that names a file or otherwise is never settable)."""

    def __init__(self, message: str, field: str, code: str = "invalid_config") -> None:
        super().__init__(message)
        self.field = field
        self.code = code


@dataclasses.dataclass(frozen=True)
class Choice:
    """One of `options` (`many`: a non-empty list of them); `optional`: null too. `enum` ("module:Class"):
    the generator wants that enum's members, which the checked config then holds (a StrEnum is still its
    string in JSON)."""

    options: tuple[str, ...]
    many: bool = True
    optional: bool = False
    enum: str | None = None


@dataclasses.dataclass(frozen=True)
class Words:
    """Short words, each matching `pattern` (`many`: a non-empty list of at most `max_items`)."""

    pattern: str
    many: bool = True
    max_items: int = MAX_ITEMS
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class Numbers:
    """A non-empty list of numbers in [low, high] (`pairs`: of [low, high] pairs in that range)."""

    low: float
    high: float
    pairs: bool = False


@dataclasses.dataclass(frozen=True)
class Refused:
    why: str


Rule = Choice | Words | Numbers | Refused

_OPERATORS = ("+", "-", "*", "/")
_NAME = r"[A-Za-z][A-Za-z' -]{0,31}"
_WEIGHTS = Numbers(0.0, float(NUMBER_LIMIT))
_FILE = Refused("it names a file the generator reads; only the package's own data is used")
_NESTED = Refused("it holds other tasks' configs; generate one task per job")
_STRUCTURED = Refused("structured formatting options are not settable; the task's defaults are used")
_DATE = Refused("dates and times are not settable over JSON; the task's defaults are used")

# Every field of reasoning-gym 0.1.25 that is not a number or a switch (test_rg_config.py holds this).
RULES: dict[tuple[str, str], Rule] = {
    ("advanced_geometry", "task_types"): Choice(("orthocenter", "incircle_radius", "angle_measure")),
    ("aiw", "male_names"): Words(_NAME, max_items=1000),
    ("aiw", "female_names"): Words(_NAME, max_items=1000),
    ("aiw", "task_types"): Choice(
        ("siblings", "friends", "colleagues"), enum="reasoning_gym.logic.aiw:TaskType"
    ),
    ("aiw", "task_type_weights"): _WEIGHTS,
    ("arc_agi", "board_format_opts"): _STRUCTURED,
    ("arc_agi", "rotations"): Choice(("90", "180", "270")),
    ("arc_agi", "mirrors"): Choice(("horizontal", "vertical", "diagonal", "counterdiagonal")),
    ("arc_agi", "rotations_weights"): _WEIGHTS,
    ("arc_agi", "mirrors_weights"): _WEIGHTS,
    ("basic_arithmetic", "operators"): Choice(_OPERATORS),
    ("basic_arithmetic", "format_style"): Choice(("simple", "natural"), many=False),
    ("basic_arithmetic", "whitespace"): Choice(("no_space", "single", "random"), many=False),
    ("boxnet", "colour_list"): Words(r"[a-z]{1,20}"),
    ("caesar_cipher", "delimiter"): Choice((".", "!", "?", ";", ":", ",", "\n"), many=False),
    ("calendar_arithmetic", "tasks"): Choice(
        (
            "weekday_offset",
            "weekday_of_date",
            "weekday_of_date_from_first_date",
            "recurring_event_day",
            "count_days",
            "count_business_days",
            "is_leap_year",
        ),
        optional=True,
    ),
    ("complex_arithmetic", "operations"): Choice(_OPERATORS),
    ("complex_arithmetic", "operations_weights"): _WEIGHTS,
    ("composite", "datasets"): _NESTED,
    ("countdown", "operators"): Choice(_OPERATORS),
    ("family_relationships", "male_names"): Words(_NAME, max_items=1000),
    ("family_relationships", "female_names"): Words(_NAME, max_items=1000),
    ("figlet_font", "static_word"): Words(r"[A-Za-z]{1,32}", many=False, optional=True),
    ("figlet_font", "static_font"): Choice((), many=False, optional=True),  # the package's fonts, below
    ("fraction_simplification", "styles"): Choice(("plain", "latex_inline", "latex_frac", "latex_dfrac")),
    ("intermediate_integration", "problem_types"): Choice(
        (
            "linear",
            "radical",
            "log_inverse_trig",
            "trigonometric",
            "polynomial_exp_trig",
            "exponential",
            "cyclic",
            "repeated_parts",
        )
    ),
    ("intermediate_integration", "problem_type_weights"): _WEIGHTS,
    ("intermediate_integration", "symbols"): Choice(("x", "X")),
    ("intermediate_integration", "operators"): Choice(("+", "-")),
    ("polynomial_equations", "operators"): Choice(("+", "-")),
    ("polynomial_multiplication", "variables"): Words(r"[a-z]", max_items=26),
    ("polynomial_multiplication", "operators"): Choice(("+", "-")),
    ("puzzle24", "operators"): Choice(_OPERATORS),
    ("rearc", "board_format_opts"): _STRUCTURED,
    ("rearc", "rng_difficulty_ranges"): Numbers(0.0, 1.0, pairs=True),
    ("rearc", "rng_difficulty_weights"): _WEIGHTS,
    ("rearc", "pso_difficulty_ranges"): Numbers(0.0, 1.0, pairs=True),
    ("rearc", "pso_difficulty_weights"): _WEIGHTS,
    ("simple_equations", "operators"): Choice(("+", "-", "*")),
    ("simple_equations", "operators_weights"): _WEIGHTS,
    ("simple_integration", "operators"): Choice(("+", "-")),
    ("simple_integration", "symbols"): Choice(("x", "X")),
    ("spell_backward", "data_file"): _FILE,
    ("time_intervals", "min_time"): _DATE,
    ("time_intervals", "max_time"): _DATE,
    ("time_intervals", "min_date"): _DATE,
    ("time_intervals", "max_date"): _DATE,
    ("time_intervals", "task_types"): Choice(
        ("time", "time_seconds", "time_ms", "date", "datetime", "datetime_tz")
    ),
    ("word_sorting", "transformation"): Choice(
        ("lowercase", "uppercase", "original", "randomcase"),
        many=False,
        enum="reasoning_gym.algorithmic.word_sorting:TextTransformation",
    ),
}
REFUSED = frozenset(key for key, rule in RULES.items() if isinstance(rule, Refused))


# --- the numeric fields, read from the installed package -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NumberField:
    kind: str  # int | float | bool
    optional: bool
    limit: float


def _kind(annotation: Any) -> tuple[str, bool] | None:
    """('int' | 'float' | 'bool', optional) for a numeric annotation, else None."""
    optional = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) != 1:
            return None
        annotation, optional = args[0], True
    names = {bool: "bool", int: "int", float: "float"}
    return (names[annotation], optional) if annotation in names else None


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


@functools.cache
def field_kinds(task: str) -> dict[str, NumberField | Rule]:
    """Every settable field of `task` with what it takes (RULES, else its numeric annotation). A field that
    is neither is left out (so refused as unknown); RESERVED are left out."""
    config_class = _registry()[task][1]
    hints = typing.get_type_hints(config_class)
    kinds: dict[str, NumberField | Rule] = {}
    for field in dataclasses.fields(config_class):
        if field.name in RESERVED:
            continue
        rule = RULES.get((task, field.name))
        if rule is not None:
            kinds[field.name] = _with_fonts(rule) if field.name == "static_font" else rule
            continue
        kind = _kind(hints.get(field.name, field.type))
        if kind is not None:
            default = _default(field)
            scale = abs(default) * DEFAULT_SCALE if isinstance(default, int | float) else 0
            kinds[field.name] = NumberField(kind[0], kind[1], max(float(NUMBER_LIMIT), float(scale)))
    return kinds


def _with_fonts(rule: Rule) -> Rule:
    from reasoning_gym.cognition.figlet_fonts import OK_FONTS

    return dataclasses.replace(rule, options=tuple(OK_FONTS)) if isinstance(rule, Choice) else rule


# --- the check ------------------------------------------------------------------------------------------------


def check_config(task: str, config: Any, where: str) -> dict[str, Any]:
    """The config as the generator will get it (a new dict), or ConfigError naming `<where>.<field>`. The
    task must be a known reasoning-gym task (the caller checks the name first)."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"{where} must be an object of the task's fields", where)
    kinds = field_kinds(task)
    checked: dict[str, Any] = {}
    for name, value in config.items():
        field = safejson.dotted([where, str(name)])
        if name in RESERVED:
            raise ConfigError(
                f"{field} is set by the server (the meta's or the job's {name}), not in the config", field
            )
        kind = kinds.get(name) if isinstance(name, str) else None
        if kind is None:
            valid = ", ".join(sorted(kinds)) or "none"
            raise ConfigError(f"{field}: unknown field of task {task!r}; valid: {valid}", field)
        checked[name] = _checked(kind, value, field)
    return checked


def _checked(kind: NumberField | Rule, value: Any, field: str) -> Any:
    if isinstance(kind, NumberField):
        return _number(kind, value, field)
    if isinstance(kind, Refused):
        raise ConfigError(f"{field} is not accepted: {kind.why}", field, "forbidden_field")
    if value is None and getattr(kind, "optional", False):
        return None
    if isinstance(kind, Numbers):
        return _numbers(kind, value, field)
    many = kind.many
    items = value if many else [value]
    limit = kind.max_items if isinstance(kind, Words) else len(kind.options) * 4
    wanted = f"a list of 1 to {limit} values, each {_what(kind)}" if many else _what(kind)
    if many and (not isinstance(value, list) or not 1 <= len(value) <= limit):
        raise ConfigError(f"{field} must be {wanted}", field)
    for item in items:
        if not _fits(kind, item):
            raise ConfigError(f"{field} must be {wanted}", field)
    values = [_member(kind, item) for item in items]
    return values if many else values[0]


def _member(kind: Choice | Words, item: str) -> Any:
    """The enum member a generator wants for a checked string, else the string."""
    if not isinstance(kind, Choice) or kind.enum is None:
        return item
    import importlib

    module, name = kind.enum.split(":")
    return getattr(importlib.import_module(module), name)(item)


def _fits(kind: Choice | Words, item: Any) -> bool:
    if not isinstance(item, str):
        return False
    if isinstance(kind, Choice):
        return item in kind.options
    return re.fullmatch(kind.pattern, item) is not None


def _what(kind: Choice | Words) -> str:
    if isinstance(kind, Words):
        return f"a word matching {kind.pattern}"
    shown = [json_text(option) for option in kind.options[:12]]
    more = f" (and {len(kind.options) - 12} more)" if len(kind.options) > 12 else ""
    return f"one of {', '.join(shown)}{more}"


def json_text(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(kind: NumberField, value: Any, field: str) -> Any:
    if value is None and kind.optional:
        return None
    if kind.kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{field} must be true or false", field)
        return value
    if kind.kind == "int" and (not isinstance(value, int) or isinstance(value, bool)):
        raise ConfigError(f"{field} must be an integer", field)
    if not _is_number(value) or not math.isfinite(value):
        raise ConfigError(f"{field} must be a number", field)
    if abs(value) > kind.limit:
        raise ConfigError(f"{field} must be within ±{kind.limit:.0f}", field)
    return value


def _numbers(kind: Numbers, value: Any, field: str) -> list[Any]:
    what = "[low, high] pairs" if kind.pairs else "numbers"
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_ITEMS:
        raise ConfigError(f"{field} must be a list of 1 to {MAX_ITEMS} {what} in {_span(kind)}", field)
    for item in value:
        parts = item if kind.pairs and isinstance(item, list) and len(item) == 2 else [item]
        if kind.pairs and parts is not item:
            raise ConfigError(f"{field} must be a list of {what} in {_span(kind)}", field)
        if not all(_is_number(part) and kind.low <= part <= kind.high for part in parts):
            raise ConfigError(f"{field} must be a list of {what} in {_span(kind)}", field)
    return [list(item) if kind.pairs else item for item in value]


def _span(kind: Numbers) -> str:
    return f"[{kind.low:g}, {kind.high:g}]"


def task_names() -> frozenset[str]:
    return frozenset(_registry())


def _registry() -> dict[str, Any]:
    """reasoning-gym's task registry, whole: the package is imported first, since a registry read while
    another thread is still importing the package holds only the tasks registered so far."""
    import reasoning_gym  # noqa: F401
    from reasoning_gym.factory import DATASETS

    return DATASETS
