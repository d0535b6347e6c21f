"""Liveness, readiness (database, broker, migrations at head) and Prometheus metrics."""

from __future__ import annotations

import hmac

import sqlalchemy as sa
from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from service.dependencies import ServicesDep
from service.errors import Unauthenticated, Unavailable
from service.schemas import Health, Readiness, errors
from store import migrate

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness", response_model=Health)
def healthz() -> Health:
    """200 while the process serves requests; checks nothing else."""
    return Health()


@router.get(
    "/readyz",
    summary="Readiness: database, broker and schema",
    response_model=Readiness,
    responses=errors(503),
)
def readyz(services: ServicesDep) -> Readiness:
    """200 when the database answers, the broker accepts a connection and the schema is at the latest
    migration; otherwise 503 naming what failed."""
    checks: dict[str, str] = {}
    failures: list[str] = []
    try:
        with services.db.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        checks["database"] = "ok"
        current, head = migrate.current_revision(services.db.engine), migrate.head_revision()
        if current == head:
            checks["migrations"] = "ok"
        else:
            failures.append(
                f"migrations: database at {current}, code at {head} (run `python -m service migrate`)"
            )
    except Exception as err:
        failures.append(f"database: {type(err).__name__}")
    try:
        services.queue.ping()
        checks["broker"] = "ok"
    except Exception as err:
        failures.append(f"broker: {type(err).__name__}")
    if failures:
        raise Unavailable("not ready: " + "; ".join(failures), code="not_ready")
    return Readiness(checks=checks)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}},
        **errors(401),
    },
)
async def metrics(request: Request, services: ServicesDep) -> Response:
    """HTTP request counts and latencies by route, and jobs by status and queue. Needs
    `Authorization: Bearer <metrics token>` when the server sets one."""
    token = services.settings.metrics_token
    if token is not None:
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.get_secret_value().encode()):
            raise Unauthenticated("this server's /metrics needs its metrics token")
    body = await run_in_threadpool(generate_latest, services.telemetry.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
