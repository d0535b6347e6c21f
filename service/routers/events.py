"""A job's events, a page at a time or as a Server-Sent Events stream, and its live stream (the events, each
new metric row and the job object whenever it changes: what the job page draws).

Both streams are one loop (`_stream`): poll the database with a short session of its own, send what is
new, ride out a database outage with keep-alives, and end once the job has finished and everything was
sent. Both resume from the Last-Event-ID a reconnecting EventSource sends, read by one parser
(`parse_last_event_id`) that bounds every number to the 32-bit columns it is compared with: a header never
reaches the database out of range.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.concurrency import run_in_threadpool

from service import views
from service.dependencies import OwnedJob, ServicesDep, SessionDep, VisibleJob
from service.errors import BadRequest
from service.schemas import AUTHENTICATED_ERRORS, EventList, errors
from service.services import Services
from store import repository
from store.models import TERMINAL_STATUSES

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["events"], responses=AUTHENTICATED_ERRORS)

STREAM_BATCH = 500
MAX_EVENT_ID = 2**31 - 1  # job_events.seq and job_metrics.step are 32-bit integers
_NUMBER = "[0-9]{1,10}"
# One Server-Sent Event of the streams (OpenAPI describes a text/event-stream response event by event).
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
LIVE_EVENT_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {
            "type": "string",
            "description": "`<last event seq>.<next metric step>` (resume with Last-Event-ID).",
        },
        "event": {"type": "string", "enum": ["lifecycle", "metrics", "job", "end"]},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "description": "lifecycle: an event object; metrics: `{data: [{step, values}]}`; job: the job "
            "object; end: `{job_id, status}`.",
        },
        "retry": {"type": "integer"},
    },
}
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)
logger = logging.getLogger(__name__)

LastEventId = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID",
        max_length=2 * 10 + 1,
        description="Resume a stream after this id (an id the stream sent).",
    ),
]


def parse_last_event_id(value: str | None, fields: int) -> tuple[int, ...]:
    """The id a reconnecting EventSource sends back: `fields` numbers of ASCII digits joined by dots, each
    at most MAX_EVENT_ID; absent or blank, zeros. Anything else is a 400 (a browser only sends an id the
    stream gave it; anything else is a client bug worth hearing about)."""
    if value is None or not value.strip():
        return (0,) * fields
    found = re.fullmatch(r"\.".join([f"({_NUMBER})"] * fields), value.strip())
    numbers = tuple(int(part) for part in found.groups()) if found is not None else ()
    if not numbers or max(numbers) > MAX_EVENT_ID:
        shape = "an event id" if fields == 1 else "an id this stream sent, `<event seq>.<metric step>`"
        raise BadRequest(
            f"Last-Event-ID must be {shape}: ASCII digits, at most {MAX_EVENT_ID}", param="Last-Event-ID"
        )
    return numbers


@router.get(
    "/events",
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
    after: Annotated[int, Query(ge=0, le=MAX_EVENT_ID, description="Only events with a larger id.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    stream: Annotated[
        bool, Query(description="Stream as Server-Sent Events until the job finishes.")
    ] = False,
    last_event_id: LastEventId = None,
) -> EventList | StreamingResponse:
    """Events oldest first (created, running, checkpoints, pause, resume, retries, the end). The stream ends
    once the job has finished and every event was sent; reconnecting with Last-Event-ID loses nothing."""
    if stream or "text/event-stream" in request.headers.get("accept", ""):
        (seq,) = parse_last_event_id(last_event_id, 1)
        job_id = job.id
        session.close()  # the stream polls with short sessions of its own
        return _streaming(services, job_id, Cursor(max(after, seq), None))
    rows, has_more = repository.list_events(session, job.id, after=after, limit=limit)
    return EventList(
        data=[views.event_view(e) for e in rows], has_more=has_more, last_id=rows[-1].seq if rows else None
    )


@router.get(
    "/live",
    summary="Stream a job live: its events, new metric rows and the job",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "An SSE stream until the job finishes: `lifecycle` (each event, as `/events` "
            "streams it), `metrics` (new metric rows), `job` (the job object whenever it changed), then "
            "`end`. After a `trainer.resumed` event the steps logged again are sent again.",
            "content": {"text/event-stream": {"schema": LIVE_EVENT_SCHEMA}},
        },
        **errors(404),
    },
)
async def stream_live(
    job: VisibleJob, services: ServicesDep, last_event_id: LastEventId = None
) -> StreamingResponse:
    """What the job page draws, in one stream; reconnecting with Last-Event-ID loses nothing."""
    seq, step = parse_last_event_id(last_event_id, 2)
    return _streaming(services, job.id, Cursor(seq, step))


@dataclass(frozen=True)
class Cursor:
    """Where a stream is: the last event sent and, for the live stream, the next metric step to send."""

    seq: int
    step: int | None  # None: the events stream (no metric rows)

    @property
    def sse_id(self) -> str:
        return str(self.seq) if self.step is None else f"{self.seq}.{self.step}"


@dataclass(frozen=True)
class _Batch:
    frames: list[str]  # the new events and metric rows, as SSE frames, in order
    cursor: Cursor  # after them
    status: str | None  # the job's status (None: the job is gone)
    job_json: str | None  # the live stream's job object
    full: bool  # a whole batch was read: more may be waiting


def _frame(name: str, data: str, sse_id: str | None = None) -> str:
    head = f"id: {sse_id}\n" if sse_id is not None else ""
    return f"{head}event: {name}\ndata: {data}\n\n"


def _poll(services: Services, job_id: str, cursor: Cursor) -> _Batch:
    """One look at the database: the events after the cursor and, for the live stream, the metric rows from
    its step on and the job object."""
    live = cursor.step is not None
    frames = []
    with services.db.sessions() as session:
        rows, _ = repository.list_events(session, job_id, after=cursor.seq, limit=STREAM_BATCH)
        step = cursor.step
        for row in rows:
            data = views.event_view(row).model_dump_json()
            if step is not None:
                resumed = row.data.get("step") if isinstance(row.data, dict) else None
                if row.type == "trainer.resumed" and isinstance(resumed, int):
                    step = min(step, resumed + 1)  # the steps after the checkpoint are logged again
                frames.append(_frame("lifecycle", data, Cursor(row.seq, step).sse_id))
            else:
                frames.append(_frame(row.type, data, str(row.seq)))
        seq = rows[-1].seq if rows else cursor.seq
        points: list[dict[str, object]] = []
        if step is not None:
            metric_rows, _ = repository.list_metrics(
                session, job_id, since_step=step, until_step=None, limit=STREAM_BATCH
            )
            points = [{"step": r.step, "values": views.metric_values(r.metrics)} for r in metric_rows]
            if metric_rows:
                step = metric_rows[-1].step + 1
                frames.append(
                    _frame("metrics", json.dumps({"data": points}, separators=(",", ":")), f"{seq}.{step}")
                )
        job = repository.load_job(session, job_id)
        return _Batch(
            frames,
            Cursor(seq, step),
            job.status if job is not None else None,
            views.job_view(job, services.fleet.served_queues()).model_dump_json()
            if live and job is not None
            else None,
            STREAM_BATCH in (len(rows), len(points)),
        )


def _streaming(services: Services, job_id: str, cursor: Cursor) -> StreamingResponse:
    return StreamingResponse(
        _stream(services, job_id, cursor),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _stream(services: Services, job_id: str, cursor: Cursor) -> AsyncIterator[str]:
    settings = services.settings
    deadline = time.monotonic() + settings.sse_max_duration_s
    last_write = time.monotonic()
    last_job: str | None = None
    yield f"retry: {int(settings.sse_poll_interval_s * 1000)}\n\n"
    while True:
        try:
            batch = await run_in_threadpool(_poll, services, job_id, cursor)
        except DATABASE_UNAVAILABLE as err:  # ride out an outage: the stream waits, keep-alives continue
            logger.warning("event stream of %s: database unavailable (%s); retrying", job_id, err)
            batch = _Batch([], cursor, "unknown", None, False)
        for frame in batch.frames:
            yield frame
        cursor = batch.cursor
        if batch.job_json is not None and batch.job_json != last_job:
            yield _frame("job", batch.job_json, cursor.sse_id)
            last_job = batch.job_json
        if batch.frames:
            last_write = time.monotonic()
            if batch.full:
                continue
        if batch.status is None or batch.status in TERMINAL_STATUSES:
            yield _frame("end", json.dumps({"job_id": job_id, "status": batch.status}))
            return
        if time.monotonic() > deadline:
            return
        if time.monotonic() - last_write > settings.sse_keepalive_s:
            yield ": keep-alive\n\n"
            last_write = time.monotonic()
        await asyncio.sleep(settings.sse_poll_interval_s)
