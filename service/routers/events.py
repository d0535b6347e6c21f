"""A job's events: a page at a time, or a Server-Sent Events stream that resumes from Last-Event-ID."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from service import repository, views
from service.dependencies import OwnedJob, ServicesDep, SessionDep
from service.models import TERMINAL_STATUSES, JobEvent
from service.schemas import AUTHENTICATED_ERRORS, EventList, errors
from service.services import Services

router = APIRouter(prefix="/v1/jobs/{job_id}/events", tags=["events"], responses=AUTHENTICATED_ERRORS)

STREAM_BATCH = 500


@router.get(
    "",
    summary="List or stream a job's events",
    response_model=EventList,
    responses={
        200: {
            "description": "A page of events (JSON), or with `stream=true` / `Accept: text/event-stream` an "
            "SSE stream: `id` is the event's sequence number, `event` its type, `data` the event object.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **errors(404),
    },
)
def list_events(
    job: OwnedJob,
    session: SessionDep,
    services: ServicesDep,
    request: Request,
    after: Annotated[int, Query(ge=0, le=2**31 - 1, description="Only events with a larger id.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    stream: Annotated[
        bool, Query(description="Stream as Server-Sent Events until the job finishes.")
    ] = False,
    last_event_id: Annotated[
        str | None, Header(alias="Last-Event-ID", max_length=20, description="Resume a stream after this id.")
    ] = None,
) -> EventList | StreamingResponse:
    """Events oldest first (created, running, checkpoints, pause, resume, retries, the end). The stream ends
    once the job has finished and every event was sent; reconnecting with Last-Event-ID loses nothing."""
    if stream or "text/event-stream" in request.headers.get("accept", ""):
        start = after
        if last_event_id is not None and last_event_id.strip().isdigit():
            start = max(start, int(last_event_id.strip()))
        job_id = job.id
        session.close()  # the stream polls with short sessions of its own
        return StreamingResponse(
            _event_stream(services, job_id, start),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    rows, has_more = repository.list_events(session, job.id, after=after, limit=limit)
    return EventList(
        data=[views.event_view(e) for e in rows], has_more=has_more, last_id=rows[-1].seq if rows else None
    )


def _poll(services: Services, job_id: str, after: int) -> tuple[list[JobEvent], str | None]:
    with services.db.sessions() as session:
        rows, _ = repository.list_events(session, job_id, after=after, limit=STREAM_BATCH)
        job = repository.load_job(session, job_id)
        return rows, job.status if job is not None else None


def _sse(event: JobEvent) -> str:
    data = views.event_view(event).model_dump_json()
    return f"id: {event.seq}\nevent: {event.type}\ndata: {data}\n\n"


async def _event_stream(services: Services, job_id: str, after: int) -> AsyncIterator[str]:
    settings = services.settings
    deadline = time.monotonic() + settings.sse_max_duration_s
    last_write = time.monotonic()
    yield f"retry: {int(settings.sse_poll_interval_s * 1000)}\n\n"
    while True:
        rows, status = await run_in_threadpool(_poll, services, job_id, after)
        for event in rows:
            yield _sse(event)
            after = event.seq
        if rows:
            last_write = time.monotonic()
            if len(rows) == STREAM_BATCH:
                continue
        if status is None or status in TERMINAL_STATUSES:
            yield f"event: end\ndata: {json.dumps({'job_id': job_id, 'status': status})}\n\n"
            return
        if time.monotonic() > deadline:
            return
        if time.monotonic() - last_write > settings.sse_keepalive_s:
            yield ": keep-alive\n\n"
            last_write = time.monotonic()
        await asyncio.sleep(settings.sse_poll_interval_s)
