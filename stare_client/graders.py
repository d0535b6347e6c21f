"""Tenant graders (docs/GRADERS.md): `client.graders.validate(grader)` and `client.graders.run(grader,
data)`, sync or async like every resource (stare_client/driver.py derives the twin). A grader is the
plain object a job spec's `grader` holds (OpenAI's shapes: python, string_check, text_similarity, multi)."""

from __future__ import annotations

import builtins
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from stare_client import transport
from stare_client.driver import M, Op, operation
from stare_client.resources import Resource


class _Object(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class GraderWarning(_Object):
    code: str
    sample: str
    items: int
    checked: int
    message: str


class GraderValidation(_Object):
    object: Literal["grader.validation"] = "grader.validation"
    grader: dict[str, Any]
    warnings: list[GraderWarning]


class GraderRunError(_Object):
    kind: str
    message: str
    traceback: str | None = None


class GraderResult(_Object):
    score: float | None
    passed: bool
    error: GraderRunError | None
    output: str
    seconds: float


class GraderRun(_Object):
    object: Literal["grader.run"] = "grader.run"
    results: list[GraderResult]
    warnings: list[GraderWarning]


class Graders(Resource[M]):
    @operation
    def validate(
        self,
        grader: dict[str, Any],
        *,
        items: builtins.list[dict[str, Any]] | None = None,
        limits: dict[str, Any] | None = None,
    ) -> Op[GraderValidation]:
        """Check a grader: its fields (a 422 names the one at fault), its source loads in the server's
        sandbox and defines grade(sample, item), and the loophole check's warnings on `items` (dataset rows:
        prompt, answer and meta fields; at most 8)."""
        body: dict[str, Any] = {"grader": grader, "items": items or []}
        if limits is not None:
            body["limits"] = limits
        response = yield from self._c.send.op("POST", "/v1/graders/validate", json=body)
        return transport.parse(GraderValidation, response)

    @operation
    def run(
        self,
        grader: dict[str, Any],
        data: builtins.list[dict[str, Any]],
        *,
        limits: dict[str, Any] | None = None,
        workers: int = 1,
    ) -> Op[GraderRun]:
        """Grade each {"sample": {"output_text": ...}, "item": {...}} of `data` (at most 100) as training
        would: per row the score or the error (with its traceback), whether it passes, the output and the
        seconds; and the loophole check's warnings over the rows' items."""
        body: dict[str, Any] = {"grader": grader, "data": data, "workers": workers}
        if limits is not None:
            body["limits"] = limits
        response = yield from self._c.send.op("POST", "/v1/graders/run", json=body)
        return transport.parse(GraderRun, response)
