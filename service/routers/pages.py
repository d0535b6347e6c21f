"""The job page: a jobs list and a live job page in the browser, served by the API itself (no Grafana).

Routes under /ui, kept out of the OpenAPI schema (they are not the API; the Bearer API is unchanged):

  GET  /ui/sign-in                 the sign-in form (the key goes in a POST body, never in a URL)
  POST /ui/session                 {"api_key"} + header X-Stare-Sign-In → the session cookie (sessions.py)
  DELETE /ui/session               sign out (header X-CSRF-Token)
  GET  /ui/jobs, /ui/jobs/{id}     the pages (another tenant's job is a 404, as in the API)
  GET  /ui/jobs/{id}/report        the evaluation report (HTML)
  GET  /ui/api/...                 what the page reads, authenticated by the cookie: jobs, metrics,
                                   checkpoints (and their downloads), and `live`, the job's event stream
                                   with its new metric rows folded in (Server-Sent Events)
  POST /ui/api/jobs/{id}/{pause|resume|cancel}   (header X-CSRF-Token)
  GET  /ui/static/{name}, /ui/vendor/{name}      the page's script and style; the charting library (uPlot)
                                   from service/web/node_modules, installed by `make install` (npm ci)

Each data route calls the same route function as its /v1 twin, so both answer alike.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from contract import metrics as catalogue
from service import views
from service.dependencies import ServicesDep, SessionDep
from service.errors import BadRequest, NotFound, ServiceError, TooManyRequests, Unauthenticated
from service.principals import Principal
from service.ratelimit import retry_after_seconds
from service.routers import checkpoints as checkpoint_routes
from service.routers import jobs as job_routes
from service.routers import metrics_history, reports
from service.schemas import CheckpointList, JobList, JobObject, MetricsHistory
from service.services import Services
from service.sessions import COOKIE_NAME, COOKIE_PATH, CSRF_HEADER, SIGN_IN_HEADER, SessionSigner
from service.sessions import Session as PageSession
from store import repository
from store.models import TERMINAL_STATUSES, Job

router = APIRouter(prefix="/ui", include_in_schema=False)

WEB_ROOT = Path(__file__).resolve().parent.parent / "web"  # service/web (app.state.web_root overrides it)
INSTALL_HINT = "run `make install` (or `npm ci --prefix service/web --no-audit --no-fund`) on the API host"
# The charting library's files, as npm installs them (package.json pins the version).
VENDOR = {
    "uPlot.iife.min.js": ("node_modules/uplot/dist/uPlot.iife.min.js", "text/javascript"),
    "uPlot.min.css": ("node_modules/uplot/dist/uPlot.min.css", "text/css"),
}
STATIC = {
    "page.css": ("app/page.css", "text/css"),
    "page.js": ("app/page.js", "text/javascript"),
    "job.js": ("app/job.js", "text/javascript"),
}
# Scripts only from this origin, no inline script, no framing, no referrer (ids stay on this site).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
LIVE_BATCH = 1000
QUADRANT_LABELS = {  # as the report names them
    "pos_low": "Â>0, low surprisal",
    "pos_high": "Â>0, high surprisal",
    "neg_low": "Â<0, low surprisal",
    "neg_high": "Â<0, high surprisal",
}


class Forbidden(ServiceError):
    status_code = 403
    code = "forbidden"


# ------------------------------------------------------------------------------------------------ charts


def _series(key: str, label: str, **style: Any) -> dict[str, Any]:
    metric = catalogue.get(key)
    return {"key": metric.key, "label": label, "unit": metric.unit, "help": metric.help, **style}


def chart_groups() -> list[dict[str, Any]]:
    """The page's charts, as the report draws them (trainer/report/page.py) plus throughput and tool use.
    The page draws a chart only when the job logged at least one of its series."""
    quadrants = [_series(f"quadrant/{q}_fraction", label) for q, label in QUADRANT_LABELS.items()]
    tools = [_series(m.key, m.key.removeprefix("tool/").replace("_", " ")) for m in catalogue.CATALOGUE]
    tools = [s for s in tools if s["key"].startswith("tool/")]
    return [
        {
            "id": "entropy",
            "title": "Policy entropy",
            "y": "entropy (nats)",
            "series": [
                _series("entropy/mean", "policy entropy"),
                _series("stare/target_entropy", "target entropy", dash=True),
            ],
            "band": [catalogue.BAND_LOW, catalogue.BAND_HIGH],
        },
        {
            "id": "gate",
            "title": "STARE gate",
            "y": "gate / factor",
            "series": [
                _series("stare/gate_on", "gate on", stepped=True),
                _series("stare/reweight_w", "W (positive reweight)"),
                _series("stare/reweight_m", "M (negative reweight)"),
            ],
        },
        {"id": "quadrants", "title": "Quadrant token fractions", "y": "fraction", "series": quadrants},
        {
            "id": "reward",
            "title": "Reward and accuracy",
            "y": "reward / accuracy",
            "series": [_series("reward/mean", "reward mean"), _series("reward/accuracy", "accuracy")],
        },
        {
            "id": "length",
            "title": "Response length",
            "y": "tokens",
            "series": [
                _series("response/length_mean", "mean length"),
                _series("response/length_max", "longest"),
            ],
        },
        {
            "id": "throughput",
            "title": "Throughput",
            "y": "tokens/s",
            "series": [_series("perf/tokens_per_second", "tokens per second")],
        },
        {
            "id": "step_time",
            "title": "Step time",
            "y": "seconds",
            "series": [
                _series("perf/step_seconds", "step"),
                _series("perf/generation_seconds", "generation"),
                _series("perf/update_seconds", "update"),
            ],
        },
        {"id": "tool", "title": "Tool use", "y": "per response / rate", "series": tools},
    ]


# ------------------------------------------------------------------------------------------------ sessions


@dataclass(frozen=True)
class PageUser:
    principal: Principal
    session: PageSession
    csrf: str


def _signer(request: Request) -> SessionSigner:
    signer: SessionSigner | None = getattr(request.app.state, "session_signer", None)
    if signer is None:
        settings = request.app.state.services.settings
        secret = settings.session_secret.get_secret_value().encode() if settings.session_secret else None
        signer = SessionSigner(secret, settings.session_ttl_s)
        request.app.state.session_signer = signer
    return signer


def _load_principal(services: Services, session: PageSession) -> Principal | None:
    with services.db.sessions() as db:
        key = repository.get_api_key(db, session.tenant_id, session.key_id)
        if key is None or key.revoked_at is not None:
            return None
        tenant = repository.get_tenant(db, key.tenant_id)
        return Principal.of(key, tenant) if tenant is not None else None


async def optional_user(request: Request, services: ServicesDep) -> PageUser | None:
    """The signed-in user from the session cookie (its key checked again: a revoked key is signed out), or
    None. Each request spends a token of the key's rate bucket, as a Bearer request does."""
    signer = _signer(request)
    session = signer.verify(request.cookies.get(COOKIE_NAME))
    if session is None:
        return None
    principal = await run_in_threadpool(_load_principal, services, session)
    if principal is None:
        return None
    wait_s = await services.limiter.acquire_async(principal.key.id)
    if wait_s > 0:
        raise TooManyRequests("rate limit exceeded; retry later", retry_after_s=retry_after_seconds(wait_s))
    return PageUser(principal, session, signer.csrf_token(session))


OptionalUser = Annotated[PageUser | None, Depends(optional_user)]


async def required_user(user: OptionalUser) -> PageUser:
    if user is None:
        raise Unauthenticated("not signed in: sign in at /ui/sign-in", code="not_signed_in")
    return user


RequiredUser = Annotated[PageUser, Depends(required_user)]


async def csrf_checked_user(
    request: Request,
    user: RequiredUser,
    token: Annotated[str | None, Header(alias=CSRF_HEADER, max_length=200)] = None,
) -> PageUser:
    """State-changing calls: the session cookie (SameSite=Strict) and the page's CSRF token in a header."""
    if not _signer(request).csrf_ok(user.session, token):
        raise Forbidden(f"missing or wrong {CSRF_HEADER} header", code="csrf_failed")
    return user


CsrfUser = Annotated[PageUser, Depends(csrf_checked_user)]
JobId = Annotated[str, PathParam(max_length=64)]


def _job(session: Session, user: PageUser, job_id: str) -> Job:
    job = repository.get_job(session, user.principal.tenant.id, job_id)
    if job is None:
        raise NotFound(f"no job with id {job_id!r}", param="job_id")
    return job


class SignIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    api_key: str = Field(min_length=1, max_length=200, description="An API key of the tenant.")


def _find_key(services: Services, presented: str) -> Principal | None:
    with services.db.sessions() as db:
        found = repository.find_api_key(db, presented)
        return Principal.of(*found) if found is not None else None


@router.post("/session")
async def sign_in(
    body: SignIn,
    request: Request,
    services: ServicesDep,
    marker: Annotated[str | None, Header(alias=SIGN_IN_HEADER, max_length=20)] = None,
) -> JSONResponse:
    """Check the key and set the session cookie. The custom header keeps other sites' forms out (a
    cross-site request cannot send it without a CORS preflight, which this server never grants)."""
    if marker != "1":
        raise BadRequest(f"sign in from the sign-in page (header {SIGN_IN_HEADER}: 1)", param=SIGN_IN_HEADER)
    principal = await run_in_threadpool(_find_key, services, body.api_key.strip())
    if principal is None:
        raise Unauthenticated("invalid API key")
    if principal.key.revoked_at is not None:
        raise Unauthenticated("this API key was revoked", code="api_key_revoked")
    signer = _signer(request)
    cookie, session = signer.issue(principal.key.id, principal.tenant.id)
    response = JSONResponse(
        {"tenant": principal.tenant.name, "expires": session.expires, "next": "/ui/jobs"},
        headers={"Cache-Control": "no-store"},
    )
    response.set_cookie(
        COOKIE_NAME,
        cookie,
        max_age=int(signer.ttl_s),
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.delete("/session")
async def sign_out(request: Request, user: OptionalUser) -> JSONResponse:
    """Clear the cookie. A signed-in caller must send the CSRF token (another site cannot sign one out)."""
    if user is not None and not _signer(request).csrf_ok(user.session, request.headers.get(CSRF_HEADER)):
        raise Forbidden(f"missing or wrong {CSRF_HEADER} header", code="csrf_failed")
    response = JSONResponse({"signed_out": True}, headers={"Cache-Control": "no-store"})
    response.delete_cookie(
        COOKIE_NAME, path=COOKIE_PATH, httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )
    return response


# ----------------------------------------------------------------------------------------- static files


def _web_root(request: Request) -> Path:
    root: Path | None = getattr(request.app.state, "web_root", None)
    return root if root is not None else WEB_ROOT


def _missing_vendor(request: Request) -> str | None:
    root = _web_root(request)
    missing = [name for name, (relative, _) in VENDOR.items() if not (root / relative).is_file()]
    if not missing:
        return None
    return (
        f"The job page's charting library (uPlot: {', '.join(missing)}) is not installed under "
        f"{root / 'node_modules'}: {INSTALL_HINT}."
    )


def _not_installed(message: str) -> HTMLResponse:
    return _html(_layout("Not installed", f"<h1>Not installed</h1><p>{html.escape(message)}</p>"), 503)


@router.get("/vendor/{name}")
async def vendor_file(request: Request, name: Annotated[str, PathParam(max_length=64)]) -> Response:
    if name not in VENDOR:
        raise NotFound(f"no file {name!r}", param="name")
    relative, media_type = VENDOR[name]
    path = _web_root(request) / relative
    if not path.is_file():
        return Response(
            f"{name} is not installed: {INSTALL_HINT}\n", status_code=503, media_type="text/plain"
        )
    return FileResponse(path, media_type=media_type, headers={"Cache-Control": "public, max-age=3600"})


@router.get("/static/{name}")
async def static_file(name: Annotated[str, PathParam(max_length=64)]) -> Response:
    if name not in STATIC:
        raise NotFound(f"no file {name!r}", param="name")
    relative, media_type = STATIC[name]
    return FileResponse(WEB_ROOT / relative, media_type=media_type, headers={"Cache-Control": "no-cache"})


# ------------------------------------------------------------------------------------------------ pages


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=SECURITY_HEADERS)


def _layout(title: str, body: str, *, user: PageUser | None = None, scripts: tuple[str, ...] = ()) -> str:
    meta = f'<meta name="csrf-token" content="{html.escape(user.csrf)}">' if user else ""
    nav = ""
    if user is not None:
        nav = (
            '<nav><a href="/ui/jobs">Jobs</a>'
            f'<span class="tenant">{html.escape(user.principal.tenant.name)}</span>'
            '<button type="button" id="sign-out">Sign out</button></nav>'
        )
    tags = "".join(f'<script src="{src}" defer></script>' for src in ("/ui/static/page.js", *scripts))
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{meta}<title>{html.escape(title)} · stare-rl</title>"
        '<link rel="stylesheet" href="/ui/vendor/uPlot.min.css">'
        '<link rel="stylesheet" href="/ui/static/page.css">'
        f'{tags}</head><body><header><a class="brand" href="/ui/jobs">stare-rl</a>{nav}</header>'
        f"<main>{body}</main></body></html>"
    )


def _sign_in_redirect(target: str) -> RedirectResponse:
    return RedirectResponse(f"/ui/sign-in?next={target}", status_code=303, headers=SECURITY_HEADERS)


@router.get("")
async def index() -> RedirectResponse:
    return RedirectResponse("/ui/jobs", status_code=303)


_NEXT = re.compile(r"/ui/jobs(/job_[A-Za-z0-9_-]{1,60})?")


@router.get("/sign-in")
async def sign_in_page(
    request: Request, next: Annotated[str | None, Query(max_length=100)] = None
) -> HTMLResponse:
    missing = _missing_vendor(request)
    if missing is not None:
        return _not_installed(missing)
    target = next if next is not None and _NEXT.fullmatch(next) else "/ui/jobs"
    body = (
        "<h1>Sign in</h1><p>Sign in with an API key of your tenant (<code>python -m service create-key "
        "TENANT</code>). The key is sent once, in the body of a POST; the page then keeps a session cookie "
        "that scripts cannot read.</p>"
        f'<form id="sign-in" method="post" action="/ui/session" data-next="{html.escape(target)}">'
        '<label for="api-key">API key</label>'
        '<input id="api-key" name="api_key" type="password" autocomplete="off" required>'
        '<button type="submit">Sign in</button><p class="error" id="sign-in-error" role="alert"></p></form>'
    )
    return _html(_layout("Sign in", body))


def _job_row(job: JobObject) -> str:
    link = f"/ui/jobs/{job.id}"
    entropy = job.entropy
    value = f"{entropy.value:.3f}" if entropy.value is not None else "—"
    return (
        f'<tr data-job-id="{html.escape(job.id)}"><td><a href="{html.escape(link)}">{html.escape(job.id)}</a>'
        f"</td><td>{html.escape(job.name or '')}</td><td>{html.escape(job.algorithm)}</td>"
        f"<td>{html.escape(job.model)}</td>"
        f'<td><span class="status status-{html.escape(job.status)}">{html.escape(job.status)}</span></td>'
        f"<td>{job.progress.step} / {job.progress.total_steps}</td>"
        f'<td>{value} <span class="band band-{html.escape(entropy.state or "none")}">'
        f"{html.escape(entropy.state or '')}</span></td>"
        f"<td>{job.created_at:%Y-%m-%d %H:%M:%S}</td></tr>"
    )


@router.get("/jobs")
def jobs_page(request: Request, user: OptionalUser, session: SessionDep) -> Response:
    missing = _missing_vendor(request)
    if missing is not None:
        return _not_installed(missing)
    if user is None:
        return _sign_in_redirect("/ui/jobs")
    listing = job_routes.list_jobs(user.principal.tenant, session, after=None, limit=100, status=None)
    rows = "".join(_job_row(job) for job in listing.data)
    table = (
        '<table id="jobs" class="list"><thead><tr><th>job</th><th>name</th><th>algorithm</th><th>model</th>'
        "<th>status</th><th>step</th><th>entropy</th><th>created (UTC)</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        if rows
        else "<p>No jobs yet: submit one with <code>POST /v1/jobs</code>.</p>"
    )
    more = "<p>Showing the newest 100 jobs.</p>" if listing.has_more else ""
    return _html(_layout("Jobs", f"<h1>Jobs</h1>{table}{more}", user=user))


@router.get("/jobs/{job_id}")
def job_page(request: Request, job_id: JobId, user: OptionalUser, session: SessionDep) -> Response:
    missing = _missing_vendor(request)
    if missing is not None:
        return _not_installed(missing)
    if user is None:
        target = f"/ui/jobs/{job_id}" if _NEXT.fullmatch(f"/ui/jobs/{job_id}") else "/ui/jobs"
        return _sign_in_redirect(target)
    job = repository.get_job(session, user.principal.tenant.id, job_id)
    if job is None:
        body = f"<h1>Not found</h1><p>No job with id <code>{html.escape(job_id)}</code>.</p>"
        return _html(_layout("Not found", body, user=user), 404)
    view = views.job_view(job)
    title = view.name or view.id
    body = (
        f'<section id="job" data-job-id="{html.escape(view.id)}">'
        f"<h1>{html.escape(title)}</h1>"
        f'<p class="facts"><code>{html.escape(view.id)}</code> · {html.escape(view.algorithm)} on '
        f"{html.escape(view.model)} · "
        f'<span id="status" class="status status-{html.escape(view.status)}">{html.escape(view.status)}</span>'
        f' · step <span id="step">{view.progress.step}</span> / {view.progress.total_steps}'
        ' · entropy <span id="entropy-value">—</span> <span id="entropy-state" class="band"></span></p>'
        '<p class="actions">'
        '<button type="button" data-action="pause">Pause</button>'
        '<button type="button" data-action="resume">Resume</button>'
        '<button type="button" data-action="cancel">Cancel</button>'
        f'<a href="/ui/jobs/{html.escape(view.id)}/report" id="report-link">Evaluation report</a>'
        '<span id="action-error" class="error" role="alert"></span></p>'
        '<p class="overlay"><label for="overlay-job">Overlay another job</label>'
        '<select id="overlay-job"><option value="">choose a job</option></select>'
        '<button type="button" id="overlay-add">Overlay</button><span id="overlays"></span></p>'
        '<div id="charts"></div>'
        '<h2>Checkpoints</h2><table id="checkpoints" class="list"><thead><tr><th>step</th><th>created '
        "(UTC)</th><th>size</th><th>entropy</th><th></th></tr></thead><tbody></tbody></table>"
        "</section>"
        f'<script type="application/json" id="chart-groups">{_json_for_html(chart_groups())}</script>'
        f'<script type="application/json" id="job-data">{_json_for_html(view.model_dump(mode="json"))}'
        "</script>"
    )
    return _html(
        _layout(title, body, user=user, scripts=("/ui/vendor/uPlot.iife.min.js", "/ui/static/job.js"))
    )


def _json_for_html(value: Any) -> str:
    """JSON safe inside a <script type="application/json"> element (no `</script>`, no `<!--`)."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@router.get("/jobs/{job_id}/report")
def report_page(request: Request, job_id: JobId, user: OptionalUser, session: SessionDep) -> Response:
    if user is None:
        return _sign_in_redirect("/ui/jobs")
    job = repository.get_job(session, user.principal.tenant.id, job_id)
    if job is None:
        body = f"<h1>Not found</h1><p>No job with id <code>{html.escape(job_id)}</code>.</p>"
        return _html(_layout("Not found", body, user=user), 404)
    return reports.get_report(job, session, request, format="html")


# ------------------------------------------------------------------------------------- the page's data


@router.get("/api/jobs")
def api_jobs(
    user: RequiredUser,
    session: SessionDep,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 100,
) -> JobList:
    return job_routes.list_jobs(user.principal.tenant, session, after=after, limit=limit, status=None)


@router.get("/api/jobs/{job_id}")
def api_job(job_id: JobId, user: RequiredUser, session: SessionDep) -> JobObject:
    return views.job_view(_job(session, user, job_id))


@router.get("/api/jobs/{job_id}/metrics", response_model=None)
def api_metrics(
    request: Request,
    job_id: JobId,
    user: RequiredUser,
    session: SessionDep,
    since_step: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> Response | MetricsHistory:
    return metrics_history.get_metrics(
        _job(session, user, job_id),
        session,
        request,
        format="json",
        since_step=since_step,
        until_step=None,
        names=None,
        limit=100_000,
    )


@router.get("/api/jobs/{job_id}/checkpoints")
def api_checkpoints(job_id: JobId, user: RequiredUser, session: SessionDep) -> CheckpointList:
    listing = checkpoint_routes.list_checkpoints(_job(session, user, job_id), session)
    for ckpt in listing.data:  # the page downloads through its own cookie-authenticated route
        ckpt.download_url = f"/ui/api/jobs/{ckpt.job_id}/checkpoints/{ckpt.id}/download"
    return listing


@router.get("/api/jobs/{job_id}/checkpoints/{checkpoint_id}/download")
def api_download(
    job_id: JobId,
    checkpoint_id: Annotated[str, PathParam(max_length=64)],
    user: RequiredUser,
    session: SessionDep,
    services: ServicesDep,
) -> Response:
    job = _job(session, user, job_id)
    checkpoint = repository.get_checkpoint(session, job.id, checkpoint_id)
    if checkpoint is None:
        raise NotFound(f"no checkpoint with id {checkpoint_id!r} in job {job.id}", param="checkpoint_id")
    return checkpoint_routes.download_checkpoint(checkpoint, job, session, services)


@router.post("/api/jobs/{job_id}/{action}")
def api_action(
    job_id: JobId,
    action: Literal["pause", "resume", "cancel"],
    user: CsrfUser,
    session: SessionDep,
    services: ServicesDep,
) -> JobObject:
    job = _job(session, user, job_id)
    if action == "pause":
        return job_routes.pause_job(job, session)
    if action == "resume":
        return job_routes.resume_job(job, session, services)
    return job_routes.cancel_job(job, session)


_LIVE_ID = re.compile(r"([0-9]{1,10})\.([0-9]{1,10})")


@router.get("/api/jobs/{job_id}/live")
def api_live(
    job_id: JobId,
    user: RequiredUser,
    session: SessionDep,
    services: ServicesDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=24)] = None,
) -> StreamingResponse:
    """The job's event stream for the page: its events (as GET /v1/jobs/{id}/events streams them), each new
    metric row, and the job object whenever it changes; `end` once the job has finished. The SSE id is
    `<last event seq>.<next metric step>`, so a reconnecting EventSource loses nothing."""
    job = _job(session, user, job_id)
    events_after, since_step = 0, 0
    if last_event_id:
        found = _LIVE_ID.fullmatch(last_event_id.strip())
        if found is None:
            raise BadRequest("Last-Event-ID must be an id this stream sent", param="Last-Event-ID")
        events_after, since_step = int(found[1]), int(found[2])
    session.close()
    return StreamingResponse(
        _live(services, job.id, events_after, since_step),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _live_poll(
    services: Services, job_id: str, events_after: int, since_step: int
) -> tuple[list[str], list[dict[str, Any]], JobObject | None, int, int]:
    """One poll: new events (JSON), new metric rows, the job; and the cursors after them."""
    with services.db.sessions() as session:
        rows, _ = repository.list_events(session, job_id, after=events_after, limit=LIVE_BATCH)
        events = []
        for row in rows:
            events.append(views.event_view(row).model_dump_json())
            events_after = row.seq
            step = (row.data or {}).get("step") if isinstance(row.data, dict) else None
            if row.type == "trainer.resumed" and isinstance(step, int):
                since_step = min(since_step, step + 1)  # the steps after the checkpoint are logged again
        metric_rows, _ = repository.list_metrics(
            session, job_id, since_step=since_step, until_step=None, limit=LIVE_BATCH
        )
        points = [{"step": r.step, "values": views.metric_values(r.metrics)} for r in metric_rows]
        if metric_rows:
            since_step = metric_rows[-1].step + 1
        job = repository.load_job(session, job_id)
        return events, points, views.job_view(job) if job is not None else None, events_after, since_step


def _sse(name: str, data: str, cursor: str | None = None) -> str:
    head = f"id: {cursor}\n" if cursor is not None else ""
    return f"{head}event: {name}\ndata: {data}\n\n"


async def _live(services: Services, job_id: str, events_after: int, since_step: int) -> AsyncIterator[str]:
    settings = services.settings
    deadline = time.monotonic() + settings.sse_max_duration_s
    last_write = time.monotonic()
    last_job: str | None = None
    yield f"retry: {int(settings.sse_poll_interval_s * 1000)}\n\n"
    while True:
        events, points, job, events_after, since_step = await run_in_threadpool(
            _live_poll, services, job_id, events_after, since_step
        )
        cursor = f"{events_after}.{since_step}"
        for event in events:
            yield _sse("lifecycle", event, cursor)
        if points:
            yield _sse("metrics", json.dumps({"data": points}, separators=(",", ":")), cursor)
        if job is not None:
            job_json = job.model_dump_json()
            if job_json != last_job:
                yield _sse("job", job_json, cursor)
                last_job = job_json
        if events or points:
            last_write = time.monotonic()
            if len(events) == LIVE_BATCH or len(points) == LIVE_BATCH:
                continue
        if job is None or job.status in TERMINAL_STATUSES:
            yield _sse("end", json.dumps({"job_id": job_id, "status": job.status if job else None}))
            return
        if time.monotonic() > deadline:
            return
        if time.monotonic() - last_write > settings.sse_keepalive_s:
            yield ": keep-alive\n\n"
            last_write = time.monotonic()
        await asyncio.sleep(settings.sse_poll_interval_s)
