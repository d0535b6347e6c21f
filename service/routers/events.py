"""A job's events: a page at a time, or a Server-Sent Events stream that resumes from Last-Event-ID."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.concurrency import run_in_threadpool

from service import views
from service.dependencies import OwnedJob, ServicesDep, SessionDep
from service.errors import BadRequest
from service.schemas import AUTHENTICATED_ERRORS, EventList, errors
from service.services import Services
from store import repository
from store.models import TERMINAL_STATUSES, JobEvent

router = APIRouter(prefix="/v1/jobs/{job_id}/events", tags=["events"], responses=AUTHENTICATED_ERRORS)

STREAM_BATCH = 500
# One Server-Sent Event of the stream (OpenAPI describes a text/event-stream response event by event).
SSE_EVENT_SCHEMA = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "id": {"type": "string", "description": "The event's sequence number (resume with Last-Event-ID)."},
        "event": {"type": "string", "description": "The event's type, or `end` after the last one."},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "description": "The event object as JSON; for `end`, `{job_id, status}`.",
        },
        "retry": {"type": "integer"},
    },
}
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)
logger = logging.getLogger(__name__)


@router.get(
    "",
    summary="List or stream a job's events",
    response_model=EventList,
    responses={
        200: {
            "description": "A page of events (JSON), or with `stream=true` / `Accept: text/event-stream` an "
            "SSE stream: `id` is the event's sequence number, `event` its type, `data` the event object.",
            "content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
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
        start = max(after, _last_event_id(last_event_id))
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


MAX_EVENT_ID = 2**31 - 1  # job_events.seq is a 32-bit integer
_EVENT_ID = re.compile(r"[0-9]{1,10}")


def _last_event_id(value: str | None) -> int:
    """The id a reconnecting EventSource sends back: ASCII digits within the id range, else 400 (a browser
    only ever sends an id this stream gave it; anything else is a client bug worth hearing about)."""
    if value is None or not value.strip():
        return 0
    text = value.strip()
    if not _EVENT_ID.fullmatch(text) or int(text) > MAX_EVENT_ID:
        raise BadRequest(
            f"Last-Event-ID must be an event id: ASCII digits, at most {MAX_EVENT_ID}",
            param="Last-Event-ID",
        )
    return int(text)


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
        try:
            rows, status = await run_in_threadpool(_poll, services, job_id, after)
        except DATABASE_UNAVAILABLE as err:  # ride out an outage: the stream waits, keep-alives continue
            logger.warning("event stream of %s: database unavailable (%s); retrying", job_id, err)
            rows, status = [], "unknown"
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
