"""Tenant graders: validate one, and run one on samples, in the sandbox (service/grading.py;
docs/GRADERS.md)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from contract.graders import GraderLimitsSpec
from service import grading
from service.dependencies import CurrentTenant, ServicesDep
from service.errors import Unprocessable
from service.grader_schemas import GraderRun, GraderRunResponse, GraderValidate, GraderValidation
from service.schemas import AUTHENTICATED_ERRORS

router = APIRouter(prefix="/v1/graders", tags=["graders"], responses=AUTHENTICATED_ERRORS)

EXAMPLE_ITEM = {"prompt": "What is 2 + 2?", "answer": "4"}


def _limits(given: GraderLimitsSpec | None, services: Any) -> GraderLimitsSpec:
    settings = services.settings
    if given is None:  # the deployment's ceilings: OpenAI's defaults unless the operator lowered them
        return GraderLimitsSpec(
            timeout_s=settings.grader_max_timeout_s,
            memory_mb=settings.grader_max_memory_mb,
            disk_mb=settings.grader_max_disk_mb,
        )
    return grading.limits_within(given, settings.grader_limits(), "limits")


@router.post("/validate", summary="Validate a grader", response_model=GraderValidation)
async def validate_grader(
    body: GraderValidate, tenant: CurrentTenant, services: ServicesDep
) -> GraderValidation:
    """The grader's schema and size (422 naming the field), then, in the sandbox: its source loads and
    defines grade(sample, item) with two parameters (422 `grader_error` with the traceback otherwise).
    Then the loophole check on `items` (or one example row): adversarial samples (empty, whitespace, the
    prompt echoed, 100 kB, a syntax-error-like text, the reference itself) and the warnings they earn."""
    grader = grading.parsed(body.grader)
    limits = _limits(body.limits, services)
    items = body.items or [EXAMPLE_ITEM]
    findings = await services.graders.run(tenant.id, grading.validate_blocking, grader, items, limits)
    return GraderValidation(grader=grader.model_dump(mode="json"), warnings=findings)


@router.post("/run", summary="Run a grader on samples", response_model=GraderRunResponse)
async def run_grader(body: GraderRun, tenant: CurrentTenant, services: ServicesDep) -> GraderRunResponse:
    """Grades each {sample, item} of `data` as training would: per row the score (a finite float) or the
    error (an exception with its traceback, a value that is not a finite number, a timeout past
    limits.timeout_s, a crash), whether it passes, what the code printed (cut) and the seconds. The
    loophole check's warnings over the rows' items come with them."""
    grader = grading.parsed(body.grader)
    limits = _limits(body.limits, services)
    if body.workers > services.settings.grader_max_workers:
        raise Unprocessable(
            f"workers is {body.workers}, above this deployment's limit {services.settings.grader_max_workers}",
            param="workers",
            code="exceeds_limit",
        )
    rows = [(row.sample.output_text, row.item) for row in body.data]
    results, findings = await services.graders.run(
        tenant.id, grading.run_blocking, grader, rows, limits, body.workers
    )
    return GraderRunResponse(results=results, warnings=findings)
