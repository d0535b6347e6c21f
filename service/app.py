"""The FastAPI application: `create_app(settings)`.

Every 4xx/5xx leaves through the handlers below in one shape, {"error": {"code", "message", "param"}}:
domain errors (service.errors) carry their status and code; FastAPI's validation errors name the offending
field as a dotted path; Starlette's HTTP errors (unknown route, wrong method, body too large) and database
outages (503 with Retry-After) and data errors (422) get codes too; anything else is a logged 500 with no
detail leaked. Before any of that, service.boundary refuses bodies over the size limit, NUL characters in the
path, query or headers, and JSON that breaks the document rules (contract.safejson).
"""

from __future__ import annotations

import errno
import gc
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio.to_thread
import psycopg
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from sqlalchemy.exc import (
    DataError,
    DisconnectionError,
    IntegrityError,
    InterfaceError,
    OperationalError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException

from contract.spec import TrainSpec
from contract.spec_problems import dotted, plain_words
from service import __version__
from service.boundary import RequestBoundary
from service.dependencies import (
    authenticate_scope,
    client_address,
    refuse_unknown_query_parameters,
    spend_address_token,
)
from service.errors import ServiceError, error_body, http_error
from service.routers import (
    api_keys,
    checkpoints,
    events,
    files,
    graders,
    health,
    identity,
    jobs,
    metrics_history,
    models,
    pages,
    reports,
    verifiers,
)
from service.services import Services
from service.sessions import SessionSigner
from service.settings import Settings
from service.telemetry import TelemetryMiddleware
from service.uploads import MULTIPART_OVERHEAD_BYTES
from store.errors import StoreError

logger = logging.getLogger(__name__)

DESCRIPTION = """\
Reinforcement fine-tuning of language models with entropy kept in a band (STARE, GRPO, DAPO and more).

Submit a job spec, watch its entropy status and metrics, and download its checkpoints and report.
Authenticate every `/v1` call with `Authorization: Bearer <API key>`. Every error has the shape
`{"error": {"code", "message", "param"}}`, where `param` names the offending field.
Lists are paginated with a cursor: pass the last id you saw as `after`.
"""

TAGS = [
    {"name": "jobs", "description": "Submit, watch, pause, resume and cancel training jobs."},
    {
        "name": "events",
        "description": "A job's lifecycle events, as pages or as a Server-Sent Events stream.",
    },
    {"name": "metrics", "description": "A job's per-step training metrics (JSON or CSV)."},
    {"name": "checkpoints", "description": "A job's checkpoints, downloadable as tar archives."},
    {"name": "reports", "description": "A job's evaluation report (JSON or a self-contained HTML page)."},
    {"name": "files", "description": "JSONL datasets for training tasks, checked line by line on upload."},
    {"name": "catalogue", "description": "Base models and answer verifiers this server offers."},
    {"name": "identity", "description": "The caller's tenant and API keys."},
    {"name": "health", "description": "Liveness, readiness and Prometheus metrics (no authentication)."},
]

HTTP_CODES = {
    400: "invalid_request",
    401: "invalid_api_key",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limit_exceeded",
}


# ---------------------------------------------------------------------------------------- error handlers


async def _service_error(_: Request, exc: Exception) -> JSONResponse:
    exc = http_error(exc)  # a ServiceError, or a store error mapped to its status
    return JSONResponse(
        error_body(exc.code, exc.message, exc.param, exc.details),
        status_code=exc.status_code,
        headers=exc.headers,
    )


def _validation_param(loc: Sequence[Any]) -> str | None:
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    return dotted(parts) if parts else None


def _validation_message(item: dict[str, Any]) -> str:
    if item.get("type") == "extra_forbidden":
        return "unknown field"
    if item.get("type") == "missing":
        return "field required"
    return plain_words(str(item.get("msg", "invalid value")))


async def _request_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        bad = next(e for e in errors if e.get("type") == "json_invalid")
        message = f"the body is not valid JSON: {bad.get('ctx', {}).get('error', 'parse error')}"
        return JSONResponse(error_body("invalid_json", message), status_code=422)
    details = [
        {"param": _validation_param(e.get("loc", ())), "message": _validation_message(e)} for e in errors
    ]
    first = details[0] if details else {"param": None, "message": "invalid request"}
    more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
    where = f"{first['param']}: " if first["param"] else ""
    return JSONResponse(
        error_body("invalid_request", f"{where}{first['message']}{more}", first["param"], details),
        status_code=422,
    )


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = HTTP_CODES.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    return JSONResponse(error_body(code, message), status_code=exc.status_code, headers=exc.headers)


async def _integrity_error(_: Request, exc: Exception) -> JSONResponse:
    logger.warning("integrity error: %s", exc)
    return JSONResponse(
        error_body("conflict", "the request conflicts with a concurrent change; retry it"), status_code=409
    )


async def _database_unavailable(_: Request, exc: Exception) -> JSONResponse:
    logger.error("database unavailable: %s", exc)
    return JSONResponse(
        error_body("database_unavailable", "the database is unavailable; retry shortly"),
        status_code=503,
        headers={"Retry-After": "5"},
    )


async def _data_error(_: Request, exc: Exception) -> JSONResponse:
    # The boundary (service.boundary) refuses what PostgreSQL cannot store before it gets here; a value the
    # database still rejects is the caller's to fix, not a server fault.
    logger.warning("data error: %s", exc)
    return JSONResponse(
        error_body(
            "invalid_value", "a value in the request cannot be stored: check its characters and range"
        ),
        status_code=422,
    )


STORAGE_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


async def _storage_error(_: Request, exc: Exception) -> JSONResponse:
    """A fault of the artifact storage (full, read-only, I/O error) is the server's, never a 500: 507 when
    full, 503 otherwise, both with Retry-After. The path stays in the log, not in the answer."""
    assert isinstance(exc, OSError)
    logger.error("storage error: %s", exc)
    name = errno.errorcode.get(exc.errno or 0, "unknown")
    if exc.errno in STORAGE_FULL_ERRNOS:
        body = error_body("storage_full", f"the artifact storage is full ({name}); nothing was stored")
        return JSONResponse(body, status_code=507, headers={"Retry-After": "60"})
    code = "storage_read_only" if exc.errno == errno.EROFS else "storage_unavailable"
    body = error_body(code, f"the artifact storage failed ({name}); nothing was stored; retry later")
    return JSONResponse(body, status_code=503, headers={"Retry-After": "30"})


async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error", exc_info=exc)
    return JSONResponse(error_body("internal_error", "internal server error"), status_code=500)


# -------------------------------------------------------------------------------------------- the app


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    services = Services.build(settings)
    app = FastAPI(
        title="stare-rl training service",
        version=__version__,
        description=DESCRIPTION,
        openapi_tags=TAGS,
        lifespan=_lifespan(settings, services),
        dependencies=[Depends(refuse_unknown_query_parameters)],
    )
    app.state.services = services
    secret = settings.session_secret.get_secret_value().encode() if settings.session_secret else None
    app.state.session_signer = SessionSigner(secret, settings.session_ttl_s)  # the job page's sign-ins

    _add_exception_handlers(app)
    _include_routers(app)
    _add_middleware(app, settings, services)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _openapi_with_spec(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _lifespan(
    settings: Settings, services: Services
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's start and shutdown: the thread pool sized, the startup objects frozen out of the cyclic
    collector's walks, the task-check pool opened (and prewarmed); the services closed at shutdown."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # Sync routes and dependencies run in this pool; fewer threads contend less for the GIL.
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.threadpool_size
        # Everything built so far (modules, the app, its routes and schemas: ~140k objects) lives as long as
        # the process. Frozen, the cyclic collector stops walking it on every full collection, which
        # otherwise stalls the event loop for tens of milliseconds (the requests' p99) every few thousand
        # requests. Unfrozen at shutdown, so a test process that builds many apps can collect the old ones.
        gc.collect()
        gc.freeze()
        services.offload.open()  # the same app may be started again (a second TestClient, a restart)
        if settings.task_check_prewarm:
            services.offload.prewarm()
        try:
            yield
        finally:
            gc.unfreeze()
            await services.aclose()
            services.close()

    return lifespan


def _include_routers(app: FastAPI) -> None:
    # Most frequent first: a request is matched against the routers in this order.
    for module in (
        jobs,
        events,
        metrics_history,
        checkpoints,
        reports,
        files,
        models,
        verifiers,
        graders,
        identity,
        api_keys,
        health,
        pages,  # the job page (/ui, outside the OpenAPI schema)
    ):
        app.include_router(module.router)


def _add_middleware(app: FastAPI, settings: Settings, services: Services) -> None:
    """The request boundary (sizes, authentication, the sign-in gate, body checks), telemetry and the page's
    security headers; the last added is the outermost."""
    app.add_middleware(
        RequestBoundary,
        path_templates=lambda: app.openapi()["paths"],
        max_bytes=settings.max_json_body_bytes,
        upload_path="/v1/files",
        max_upload_bytes=settings.max_upload_bytes + MULTIPART_OVERHEAD_BYTES,
        authenticate=lambda scope: authenticate_scope(services, scope),
        sign_in_gate=lambda scope: spend_address_token(services, client_address(scope)),
        exception_handlers=lambda: app.exception_handlers,
        check_body=services.body_checks.check,
    )
    app.add_middleware(TelemetryMiddleware, telemetry=services.telemetry)
    app.add_middleware(pages.PageSecurityHeaders)  # outermost: the boundary's refusals under /ui too


def _add_exception_handlers(app: FastAPI) -> None:
    """Domain, validation, database and storage errors mapped to the one error shape, once."""
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(StoreError, _service_error)  # the repository's errors (store.errors)
    app.add_exception_handler(RequestValidationError, _request_validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(IntegrityError, _integrity_error)
    app.add_exception_handler(psycopg.IntegrityError, _integrity_error)  # the async write path
    app.add_exception_handler(OperationalError, _database_unavailable)
    app.add_exception_handler(InterfaceError, _database_unavailable)
    app.add_exception_handler(psycopg.OperationalError, _database_unavailable)  # the async read path
    app.add_exception_handler(psycopg.InterfaceError, _database_unavailable)
    app.add_exception_handler(DisconnectionError, _database_unavailable)
    app.add_exception_handler(PoolTimeout, _database_unavailable)  # every pooled connection busy
    app.add_exception_handler(DataError, _data_error)
    app.add_exception_handler(psycopg.DataError, _data_error)
    app.add_exception_handler(OSError, _storage_error)
    app.add_exception_handler(Exception, _internal_error)


def _openapi_with_spec(app: FastAPI) -> dict[str, Any]:
    """The generated schema plus TrainSpec (the job body's `spec` refers to it) and its parts."""
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
        tags=app.openapi_tags,
    )
    spec_schema = TrainSpec.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in spec_schema.pop("$defs", {}).items():
        components.setdefault(name, definition)
    components["TrainSpec"] = spec_schema
    return schema
