"""A job's evaluation report, built from its stored history by trainer.report (JSON or HTML)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sqlalchemy.orm import Session

from service.dependencies import OwnedJob, SessionDep
from service.schemas import AUTHENTICATED_ERRORS, errors
from store import repository
from store.models import Job
from trainer.report import build_report, render_html

router = APIRouter(prefix="/v1/jobs/{job_id}/report", tags=["reports"], responses=AUTHENTICATED_ERRORS)


@router.get(
    "",
    summary="Get a job's evaluation report",
    response_class=JSONResponse,
    responses={
        200: {
            "description": "The report as JSON (the default), or with `format=html` / `Accept: text/html` a "
            "self-contained page with plots (inline CSS and SVG, no scripts).",
            "content": {
                "application/json": {"schema": {"type": "object", "additionalProperties": True}},
                "text/html": {"schema": {"type": "string"}},
            },
        },
        **errors(404),
    },
)
def get_report(
    job: OwnedJob,
    session: SessionDep,
    request: Request,
    format: Annotated[
        Literal["json", "html"] | None, Query(description="Default: from Accept, else json.")
    ] = None,
) -> Response:
    """Evaluation before and after RL (avg@k, pass@k, response length), the entropy summary against the
    band, the STARE gate's duty cycle, the final quadrant fractions, and per-step series. Works while the
    job runs (a partial report) and after it finished."""
    report = job_report(job, session)
    as_html = format == "html" or (format is None and "text/html" in request.headers.get("accept", ""))
    if as_html:
        return HTMLResponse(render_html(report))
    return JSONResponse(report)


def job_report(job: Job, session: Session) -> dict[str, Any]:
    """The report of one job, from its stored events (the job page renders it too)."""
    report: dict[str, Any] = build_report(repository.report_events(session, job))
    report["job"]["id"] = job.id
    return report
