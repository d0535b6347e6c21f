"""A job's per-step metrics history, as JSON or CSV."""

from __future__ import annotations

import csv
import io
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from service import views
from service.dependencies import OwnedJob, SessionDep
from service.schemas import AUTHENTICATED_ERRORS, MetricPoint, MetricsHistory, errors
from store import repository

router = APIRouter(prefix="/v1/jobs/{job_id}/metrics", tags=["metrics"], responses=AUTHENTICATED_ERRORS)


@router.get(
    "",
    summary="Get a job's metrics history",
    response_model=MetricsHistory,
    responses={
        200: {
            "description": "Per-step metrics: JSON, or CSV (one row per step, one column per metric) with "
            "`format=csv` or `Accept: text/csv`.",
            "content": {"text/csv": {"schema": {"type": "string"}}},
        },
        **errors(404),
    },
)
def get_metrics(
    job: OwnedJob,
    session: SessionDep,
    request: Request,
    format: Annotated[
        Literal["json", "csv"] | None, Query(description="Default: from Accept, else json.")
    ] = None,
    since_step: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
    until_step: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    names: Annotated[
        str | None, Query(max_length=4000, description="Comma-separated metric names to keep (default: all).")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
) -> MetricsHistory | Response:
    """Every logged step (one row per step; a step redone after a resume shows its final values), oldest
    first. Names follow the metric catalogue: entropy/mean, entropy/band_state, stare/gate_on,
    reward/accuracy, perf/step_seconds, ..."""
    rows, has_more = repository.list_metrics(
        session, job.id, since_step=since_step, until_step=until_step, limit=limit
    )
    wanted = {n.strip() for n in names.split(",") if n.strip()} if names else None
    points = []
    for row in rows:
        values = views.metric_values(row.metrics)
        if wanted is not None:
            values = {k: v for k, v in values.items() if k in wanted}
        points.append(MetricPoint(step=row.step, values=values))
    columns = sorted({name for point in points for name in point.values})
    as_csv = format == "csv" or (format is None and "text/csv" in request.headers.get("accept", ""))
    if as_csv:
        return Response(
            _csv(points, columns),
            media_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="{job.id}-metrics.csv"'},
        )
    return MetricsHistory(job_id=job.id, names=columns, data=points, has_more=has_more)


def _csv(points: list[MetricPoint], columns: list[str]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["step", *columns])
    for point in points:
        writer.writerow(
            [point.step, *("" if point.values.get(c) is None else repr(point.values[c]) for c in columns)]
        )
    return out.getvalue()
