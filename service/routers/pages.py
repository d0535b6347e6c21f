"""The job page: a jobs list and a live job page in the browser, served by the API itself (no Grafana).

This module renders pages and nothing else; what the page's scripts (service/web/app/) read and change they
ask the /v1 API for, with the session cookie standing in for the API key (service.dependencies.authenticate:
the same authentication, principal cache, rate limit, ownership checks and streams as any API client).

Routes under /ui, kept out of the OpenAPI schema:

  GET  /ui/sign-in                 the sign-in form (the key goes in a POST body, never in a URL)
  POST /ui/session                 {"api_key"} + header X-Stare-Sign-In → the session cookie (sessions.py)
  DELETE /ui/session               sign out (header X-CSRF-Token)
  GET  /ui/jobs, /ui/jobs/{id}     the pages (another tenant's job is a 404, as in the API)
  GET  /ui/jobs/{id}/report        the evaluation report (HTML)
  GET  /ui/static/{name}, /ui/vendor/{name}      the page's script and style; the charting library (uPlot)
                                   from service/web/node_modules, installed by `make web` (npm ci); without
                                   it the job page still works and shows each chart as a table

Every response under /ui leaves through PageSecurityHeaders (pages, redirects, files and errors alike): a
Content-Security-Policy without inline scripts, no framing, no referrer, no caching of pages.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import views
from service.dependencies import (
    Caller,
    PageCaller,
    ServicesDep,
    SessionDep,
    key_principal,
    session_signer,
    spend_rate_token,
    tenant_job,
)
from service.errors import BadRequest, NotFound
from service.page_charts import chart_groups
from service.routers import reports
from service.schemas import JobObject
from service.sessions import COOKIE_NAME, COOKIE_PATH, SIGN_IN_HEADER
from store import repository
from trainer.report import render_html

router = APIRouter(prefix="/ui", include_in_schema=False)

PAGE_PREFIX = "/ui"
WEB_ROOT = Path(__file__).resolve().parent.parent / "web"  # service/web (app.state.web_root overrides it)
INSTALL_HINT = "run `make web` (or `npm ci --prefix service/web --no-audit --no-fund`) on the API host"
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
    "Cache-Control": "no-store",  # a route's own Cache-Control (the static files') is kept
}


class PageSecurityHeaders:
    """ASGI middleware: SECURITY_HEADERS on every response under /ui, whichever route, redirect, file or
    error handler made it, so no page can leave without them. A header the response set itself is kept."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != PAGE_PREFIX and not path.startswith(PAGE_PREFIX + "/"):
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, send_secured)


# ------------------------------------------------------------------------------------------------ sessions

JobId = Annotated[str, PathParam(max_length=64)]


class SignIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    api_key: str = Field(min_length=1, max_length=200, description="An API key of the tenant.")


def _cookie_attributes(request: Request) -> dict[str, Any]:
    return {
        "path": COOKIE_PATH,
        "httponly": True,
        "samesite": "strict",
        "secure": request.url.scheme == "https",
    }


@router.post("/session")
async def sign_in(
    body: SignIn,
    request: Request,
    services: ServicesDep,
    marker: Annotated[str | None, Header(alias=SIGN_IN_HEADER, max_length=20)] = None,
) -> JSONResponse:
    """Check the key as a Bearer request's is checked and set the session cookie. The custom header keeps
    other sites' forms out (a cross-site request cannot send it without a CORS preflight, which this server
    never grants)."""
    if marker != "1":
        raise BadRequest(f"sign in from the sign-in page (header {SIGN_IN_HEADER}: 1)", param=SIGN_IN_HEADER)
    principal = await key_principal(services, body.api_key.strip())  # (its address token: the boundary)
    await spend_rate_token(services, principal)
    signer = session_signer(request)
    cookie, session = signer.issue(principal.key.id, principal.tenant.id)
    response = JSONResponse({"tenant": principal.tenant.name, "expires": session.expires, "next": "/ui/jobs"})
    response.set_cookie(COOKIE_NAME, cookie, max_age=int(signer.ttl_s), **_cookie_attributes(request))
    return response


@router.delete("/session")
async def sign_out(request: Request, caller: PageCaller) -> JSONResponse:
    """Clear the cookie. A signed-in caller must send the CSRF token (as for every cookie-authenticated
    write: another site cannot sign one out)."""
    del caller  # authenticated (and CSRF-checked) by the dependency; a stale cookie is cleared as well
    response = JSONResponse({"signed_out": True})
    response.delete_cookie(COOKIE_NAME, **_cookie_attributes(request))
    return response


# ----------------------------------------------------------------------------------------- static files


def _web_root(request: Request) -> Path:
    root: Path | None = getattr(request.app.state, "web_root", None)
    return root if root is not None else WEB_ROOT


def _charts_installed(request: Request) -> bool:
    """Whether uPlot's files are under the web root; without them the job page draws tables."""
    root = _web_root(request)
    return all((root / relative).is_file() for relative, _ in VENDOR.values())


CHARTS_MISSING = (
    '<p class="notice" id="charts-missing">Charts need the uPlot library, which is not installed on this '
    f"server: {html.escape(INSTALL_HINT)}. Until then each chart is a table of its latest steps.</p>"
)


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


def _layout(
    title: str,
    body: str,
    *,
    caller: Caller | None = None,
    scripts: tuple[str, ...] = (),
    styles: tuple[str, ...] = (),
) -> str:
    token = caller.csrf_token if caller is not None else None
    meta = f'<meta name="csrf-token" content="{html.escape(token)}">' if token else ""
    nav = ""
    if caller is not None:
        nav = (
            '<nav><a href="/ui/jobs">Jobs</a>'
            f'<span class="tenant">{html.escape(caller.principal.tenant.name)}</span>'
            '<button type="button" id="sign-out">Sign out</button></nav>'
        )
    tags = "".join(f'<script src="{src}" defer></script>' for src in ("/ui/static/page.js", *scripts))
    links = "".join(f'<link rel="stylesheet" href="{href}">' for href in (*styles, "/ui/static/page.css"))
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{meta}<title>{html.escape(title)} · stare-rl</title>"
        f"{links}{tags}</head>"
        f'<body><header><a class="brand" href="/ui/jobs">stare-rl</a>{nav}</header>'
        f"<main>{body}</main></body></html>"
    )


def _sign_in_redirect(target: str) -> RedirectResponse:
    return RedirectResponse(f"/ui/sign-in?next={target}", status_code=303)


def _not_found(job_id: str, caller: Caller) -> HTMLResponse:
    body = f"<h1>Not found</h1><p>No job with id <code>{html.escape(job_id)}</code>.</p>"
    return HTMLResponse(_layout("Not found", body, caller=caller), 404)


@router.get("")
async def index() -> RedirectResponse:
    return RedirectResponse("/ui/jobs", status_code=303)


_NEXT = re.compile(r"/ui/jobs(/job_[A-Za-z0-9_-]{1,60})?")


@router.get("/sign-in")
async def sign_in_page(next: Annotated[str | None, Query(max_length=100)] = None) -> HTMLResponse:
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
    return HTMLResponse(_layout("Sign in", body))


def _job_row(job: JobObject) -> str:
    link = f"/ui/jobs/{job.id}"
    entropy = job.entropy
    value = f"{entropy.value:.3f}" if entropy.value is not None else "—"
    return (
        f'<tr data-job-id="{html.escape(job.id)}"><td><a href="{html.escape(link)}">{html.escape(job.id)}</a>'
        f"</td><td>{html.escape(job.name or '')}</td><td>{html.escape(job.algorithm)}</td>"
        f"<td>{html.escape(job.model)}</td>"
        f'<td><span class="status status-{html.escape(job.status)}">{html.escape(job.status)}</span>'
        f'<span class="waiting">{_waiting_text(job)}</span></td>'
        f"<td>{job.progress.step} / {job.progress.total_steps}</td>"
        f'<td>{value} <span class="band band-{html.escape(entropy.state or "none")}">'
        f"{html.escape(entropy.state or '')}</span></td>"
        f"<td>{job.created_at:%Y-%m-%d %H:%M:%S}</td></tr>"
    )


def _waiting_text(job: JobObject) -> str:
    """ " · waiting: no live worker serves queue 'x'" for a job no live worker can take (the job view's
    `waiting`; job.js renders the same from each live update), else nothing."""
    return html.escape(f" · waiting: {job.waiting.message}") if job.waiting is not None else ""


JOBS_SHOWN = 100


@router.get("/jobs")
def jobs_page(caller: PageCaller, session: SessionDep, services: ServicesDep) -> Response:
    if caller is None:
        return _sign_in_redirect("/ui/jobs")
    jobs, has_more = repository.list_jobs(session, caller.principal.tenant.id, after=None, limit=JOBS_SHOWN)
    queues = services.fleet.served_queues()
    rows = "".join(_job_row(views.job_view(job, queues)) for job in jobs)
    table = (
        '<table id="jobs" class="list"><thead><tr><th>job</th><th>name</th><th>algorithm</th><th>model</th>'
        "<th>status</th><th>step</th><th>entropy</th><th>created (UTC)</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        if rows
        else "<p>No jobs yet: submit one with <code>POST /v1/jobs</code>.</p>"
    )
    more = f"<p>Showing the newest {JOBS_SHOWN} jobs.</p>" if has_more else ""
    return HTMLResponse(_layout("Jobs", f"<h1>Jobs</h1>{table}{more}", caller=caller))


@router.get("/jobs/{job_id}")
def job_page(
    request: Request, job_id: JobId, caller: PageCaller, session: SessionDep, services: ServicesDep
) -> Response:
    if caller is None:
        target = f"/ui/jobs/{job_id}" if _NEXT.fullmatch(f"/ui/jobs/{job_id}") else "/ui/jobs"
        return _sign_in_redirect(target)
    try:
        view = views.job_view(
            tenant_job(session, caller.principal.tenant, job_id), services.fleet.served_queues()
        )
    except NotFound:
        return _not_found(job_id, caller)
    title = view.name or view.id
    charts = _charts_installed(request)
    body = (
        f'<section id="job" data-job-id="{html.escape(view.id)}">'
        f"<h1>{html.escape(title)}</h1>"
        f'<p class="facts"><code>{html.escape(view.id)}</code> · {html.escape(view.algorithm)} on '
        f"{html.escape(view.model)} · "
        f'<span id="status" class="status status-{html.escape(view.status)}">{html.escape(view.status)}</span>'
        f'<span id="waiting" class="waiting" role="status">{_waiting_text(view)}</span>'
        f' · step <span id="step">{view.progress.step}</span> / {view.progress.total_steps}'
        ' · entropy <span id="entropy-value">—</span> <span id="entropy-state" class="band"></span>'
        ' <span id="entropy-stability"></span> <span id="control"></span></p>'
        '<p class="actions">'
        '<button type="button" data-action="pause">Pause</button>'
        '<button type="button" data-action="resume">Resume</button>'
        '<button type="button" data-action="cancel">Cancel</button>'
        f'<a href="/ui/jobs/{html.escape(view.id)}/report" id="report-link">Evaluation report</a>'
        '<span id="action-error" class="error" role="alert"></span></p>'
        '<ul id="warnings" class="warnings" role="status"></ul>'
        '<p class="overlay"><label for="overlay-job">Overlay another job</label>'
        '<select id="overlay-job"><option value="">choose a job</option></select>'
        '<button type="button" id="overlay-add">Overlay</button><span id="overlays"></span></p>'
        f'{"" if charts else CHARTS_MISSING}<div id="charts"></div>'
        '<div id="samples"></div>'
        '<h2>Checkpoints</h2><table id="checkpoints" class="list"><thead><tr><th>step</th><th>created '
        "(UTC)</th><th>size</th><th>entropy</th><th></th></tr></thead><tbody></tbody></table>"
        "</section>"
        f'<script type="application/json" id="chart-groups">{_json_for_html(chart_groups())}</script>'
        f'<script type="application/json" id="job-data">{_json_for_html(view.model_dump(mode="json"))}'
        "</script>"
    )
    if not charts:
        return HTMLResponse(_layout(title, body, caller=caller, scripts=("/ui/static/job.js",)))
    scripts, styles = ("/ui/vendor/uPlot.iife.min.js", "/ui/static/job.js"), ("/ui/vendor/uPlot.min.css",)
    return HTMLResponse(_layout(title, body, caller=caller, scripts=scripts, styles=styles))


def _json_for_html(value: Any) -> str:
    """JSON safe inside a <script type="application/json"> element (no `</script>`, no `<!--`)."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@router.get("/jobs/{job_id}/report")
def report_page(job_id: JobId, caller: PageCaller, session: SessionDep) -> Response:
    if caller is None:
        return _sign_in_redirect("/ui/jobs")
    try:
        job = tenant_job(session, caller.principal.tenant, job_id)
    except NotFound:
        return _not_found(job_id, caller)
    return HTMLResponse(render_html(reports.job_report(job, session)))
