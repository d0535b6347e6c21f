"""The verifiers a job spec may name, and their parameters: names, types, defaults, descriptions.

The scoring functions live in trainer/tasks/verifiers.py, bound to these declarations by name; this part is
what the job spec validates against (in the service as in the engine) and what GET /v1/verifiers lists.
Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

EXTRACT_MODES = ("first_line", "full", "boxed", "last_number", "answer_tag")
REWARD_STYLES = ("binary", "pm1")
PARAM_TYPES = ("bool", "float", "int", "str")


@dataclass(frozen=True)
class ParamSpec:
    name: str
    type: str  # one of PARAM_TYPES
    default: Any
    description: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None

    def __post_init__(self) -> None:
        if self.type not in PARAM_TYPES:
            raise ValueError(f"param type must be one of {', '.join(PARAM_TYPES)}, got {self.type!r}")

    def check(self, verifier: str, value: Any) -> Any:
        if self.type == "bool":
            ok = isinstance(value, bool)
        elif self.type in ("float", "int"):
            numeric_types = (int, float) if self.type == "float" else (int,)
            ok = (
                not isinstance(value, bool)
                and isinstance(value, numeric_types)
                and math.isfinite(value)
                and (self.minimum is None or value >= self.minimum)
            )
        else:
            ok = isinstance(value, str) and (self.choices is None or value in self.choices)
        if not ok:
            raise ValueError(
                f"verifier {verifier!r} param {self.name!r} must be {self._expected()}, got {value!r}"
            )
        return float(value) if self.type == "float" else value

    def _expected(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(repr(choice) for choice in self.choices)
        bound = f" >= {self.minimum:g}" if self.minimum is not None else ""
        return {"bool": "true or false", "float": "a number", "int": "an integer", "str": "a string"}[
            self.type
        ] + bound

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "default": self.default, "description": self.description}
        if self.choices is not None:
            out["choices"] = list(self.choices)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        return out


@dataclass(frozen=True)
class VerifierParams:
    """A verifier's name, description and parameters (what a spec may set)."""

    name: str
    description: str
    params: tuple[ParamSpec, ...]

    def defaults(self) -> dict[str, Any]:
        return {param.name: param.default for param in self.params}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "params": {param.name: param.to_dict() for param in self.params},
        }


_EXTRACT = ParamSpec(
    "extract",
    "str",
    "first_line",
    "Which part of the completion is the answer: the first non-empty line, the full text, the last "
    "\\boxed{} content, the last number, or the last <answer>...</answer> content.",
    choices=EXTRACT_MODES,
)

VERIFIER_PARAMS: dict[str, VerifierParams] = {
    declared.name: declared
    for declared in (
        VerifierParams(
            "exact",
            "1 if the extracted answer equals the reference answer after stripping surrounding whitespace.",
            (
                _EXTRACT,
                ParamSpec("case_sensitive", "bool", False, "Compare letter case too."),
            ),
        ),
        VerifierParams(
            "numeric",
            "1 if the number in the last \\boxed{} (else the last number in the completion) equals the "
            "numeric reference answer within tolerance; accepts 1,234 / -3.5 / 2e3 / 3/4.",
            (
                ParamSpec("rel_tol", "float", 1e-9, "Relative tolerance (math.isclose).", minimum=0.0),
                ParamSpec("abs_tol", "float", 1e-6, "Absolute tolerance (math.isclose).", minimum=0.0),
            ),
        ),
        VerifierParams(
            "math_verify",
            "1 if the last \\boxed{} content (else the last number) is mathematically equivalent to the "
            "reference per HF Math-Verify (sympy): 1/2 = 0.5 = \\frac{1}{2}, x+1 = 1+x.",
            (
                ParamSpec(
                    "max_chars",
                    "int",
                    256,
                    "Longest extracted answer that is parsed; longer ones score 0 (bounds sympy time).",
                    minimum=1,
                ),
            ),
        ),
        VerifierParams(
            "reasoning_gym",
            "The reasoning-gym task's own score_answer on the entry stored with the example (reasoning-gym "
            "task sources only); partial credit possible.",
            (
                ParamSpec(
                    "extract",
                    "str",
                    "auto",
                    "auto: the last <answer>...</answer>, else the last \\boxed{}, else the first non-empty "
                    "line; or one of the fixed modes.",
                    choices=("auto", *EXTRACT_MODES),
                ),
            ),
        ),
    )
}


def get_params(name: str) -> VerifierParams:
    try:
        return VERIFIER_PARAMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown verifier {name!r}; valid: {', '.join(sorted(VERIFIER_PARAMS))}") from None


def validate_params(name: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The verifier's params with defaults filled in; ValueError naming an unknown or ill-typed param."""
    declared = get_params(name)
    given = dict(params or {})
    known = {param.name: param for param in declared.params}
    unknown = sorted(set(given) - set(known))
    if unknown:
        valid = ", ".join(known) or "none"
        raise ValueError(f"verifier {name!r} has no param(s) {unknown}; valid: {valid}")
    resolved = declared.defaults()
    for key, value in given.items():
        resolved[key] = known[key].check(name, value)
    return resolved
