"""The graders' request and response bodies (service/routers/graders.py; docs/GRADERS.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from contract.graders import GraderLimitsSpec

MAX_ROWS = 100
MAX_ITEMS = 8


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GraderSample(_Request):
    output_text: Annotated[str, StringConstraints(max_length=200_000)] = Field(
        description="The model's output; output_json is this text parsed as JSON when it parses."
    )


class GraderRow(_Request):
    sample: GraderSample
    item: dict[str, Any] = Field(
        description="The dataset row as graders see it: prompt, answer and the meta's fields ({{item.<field>}})."
    )


class GraderValidate(_Request):
    grader: dict[str, Any] = Field(
        description="A grader object as in a job spec's `grader`: python, string_check, text_similarity or multi."
    )
    items: Annotated[list[dict[str, Any]], Field(max_length=MAX_ITEMS)] = Field(
        default_factory=list,
        description="Dataset rows for the loophole check (at most 8); none: one example row.",
    )
    limits: GraderLimitsSpec | None = Field(
        default=None, description="Per-process limits (default: the spec's)."
    )


class GraderRun(_Request):
    grader: dict[str, Any]
    data: Annotated[list[GraderRow], Field(min_length=1, max_length=MAX_ROWS)]
    limits: GraderLimitsSpec | None = None
    workers: Annotated[int, Field(ge=1, le=8)] = 1


class GraderFinding(BaseModel):
    code: Literal["passes_adversarial", "misses_reference", "fails_on"]
    sample: str = Field(description="The adversarial sample: an empty output, the prompt echoed back, ...")
    items: int = Field(description="Items on which it happened.")
    checked: int = Field(description="Items checked.")
    message: str


class GraderValidation(BaseModel):
    object: Literal["grader.validation"] = "grader.validation"
    grader: dict[str, Any] = Field(description="The grader with every field resolved.")
    warnings: list[GraderFinding] = Field(description="The loophole check's warnings (docs/GRADERS.md).")


class GraderRunError(BaseModel):
    kind: str = Field(
        description="exception | not_a_number | non_finite | timeout | crashed | template | formula"
    )
    message: str
    traceback: str | None = None


class GraderRunResult(BaseModel):
    score: float | None = Field(description="A finite float; null when grading failed (see error).")
    passed: bool = Field(description="score ≥ pass_threshold (1.0 when the grader sets none).")
    error: GraderRunError | None
    output: str = Field(description="What the grader's code printed (stdout and stderr), cut.")
    seconds: float


class GraderRunResponse(BaseModel):
    object: Literal["grader.run"] = "grader.run"
    results: list[GraderRunResult]
    warnings: list[GraderFinding]
