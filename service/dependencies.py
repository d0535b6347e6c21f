"""Request dependencies, named for what they give a route: SessionDep, CurrentPrincipal, CurrentTenant,
OwnedJob (to change it), VisibleJob (to read it), OwnedFile, OwnedCheckpoint. Authentication, rate limiting
and the ownership checks live here and nowhere else: a route that takes OwnedJob only ever sees the
caller's own job (another tenant's is a 404).

Dependencies that use a SQLAlchemy session are plain functions (FastAPI runs them in its thread pool); the
ones that do not are `async def`, so they cost no thread hop. VisibleJob awaits its one statement on the
database's event-loop pool (store.async_pool), and so does OwnedFile.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, get_args, get_origin

from fastapi import Depends, Path, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.errors import NotFound, TooManyRequests, Unauthenticated, Unprocessable
from service.principals import Principal, TenantRef
from service.ratelimit import retry_after_seconds
from service.services import Services
from service.views import FileLike, JobLike
from store import repository
from store.models import Checkpoint, Job

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="An API key: `Authorization: Bearer sk-stare-...` (create one with `python -m service create-tenant`).",
)


_KNOWN_QUERY: dict[int, tuple[frozenset[str], frozenset[str]]] = {}


def _query_names(route: APIRoute) -> tuple[frozenset[str], frozenset[str]]:
    """The route's query parameters, and those of them that take several values (list-typed)."""
    names = _KNOWN_QUERY.get(id(route))
    if names is None:
        params = _dependant_query_params(route.dependant)
        names = (
            frozenset(params),
            frozenset(name for name, annotation in params.items() if _is_sequence(annotation)),
        )
        _KNOWN_QUERY[id(route)] = names
    return names


def _dependant_query_params(dependant: Dependant) -> dict[str, Any]:
    params = {param.alias: param.field_info.annotation for param in dependant.query_params}
    for sub in dependant.dependencies:
        params |= _dependant_query_params(sub)
    return params


def _is_sequence(annotation: Any) -> bool:
    origin = get_origin(annotation)
    if origin in (list, tuple, set, frozenset):
        return True
    return any(_is_sequence(arg) for arg in get_args(annotation)) if origin is not None else False


async def refuse_unknown_query_parameters(request: Request) -> None:
    """Every route's guard (an app-wide dependency): a query parameter the route does not take is a 422
    naming it, as an unknown body field is. A typo (`?limt=5`) is reported, not silently ignored. So is a
    single-valued parameter given twice (`?after=a&after=b`): which one would win is not the caller's guess."""
    if not request.scope.get("query_string"):
        return
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    known, repeatable = _query_names(route)
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name not in known:
            allowed = ", ".join(sorted(known)) or "none"
            raise Unprocessable(
                f"unknown query parameter {name!r} (this endpoint takes: {allowed})",
                param=name,
                code="unknown_parameter",
            )
        if name in seen and name not in repeatable:
            raise Unprocessable(
                f"query parameter {name!r} is given more than once; it takes one value",
                param=name,
                code="repeated_parameter",
            )
        seen.add(name)


async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_session(services: ServicesDep) -> AsyncIterator[Session]:
    """One session per request; routes that write commit explicitly (before they enqueue anything).

    Opening a session does no I/O; closing one ends a read transaction (one ROLLBACK round trip) or nothing.
    Doing both on the event loop saves two thread hops per request over a sync generator dependency."""
    session = services.db.sessions()
    try:
        yield session
    finally:
        session.close()


SessionDep = Annotated[Session, Depends(get_session)]


def _look_up(services: Services, presented: str) -> tuple[Principal, str] | None:
    """The key's principal and stored hash from the database (recording its use), or None."""
    with services.db.sessions() as session:
        found = repository.find_api_key(session, presented)
        if found is None:
            return None
        key, tenant = found
        if repository.touch_api_key(session, key):
            session.commit()
        return Principal.of(key, tenant), key.key_hash


async def authenticate(
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The caller's principal from `Authorization: Bearer <key>`, then one token from its rate bucket."""
    if credentials is None or not credentials.credentials:
        raise Unauthenticated(
            "no API key: send the header 'Authorization: Bearer <key>'", code="missing_api_key"
        )
    presented = credentials.credentials.strip()
    principal = services.principals.get(presented)
    if principal is None:
        found = await run_in_threadpool(_look_up, services, presented)
        if found is None:
            raise Unauthenticated("invalid API key")
        principal, key_hash = found
        if principal.key.revoked_at is not None:
            raise Unauthenticated("this API key was revoked", code="api_key_revoked")
        services.principals.put(key_hash, principal)
    wait_s = await services.limiter.acquire_async(principal.key.id)
    if wait_s > 0:
        raise TooManyRequests(
            f"rate limit of {services.settings.rate_limit_per_second:g} requests/s per key exceeded; retry later",
            retry_after_s=retry_after_seconds(wait_s),
        )
    return principal


CurrentPrincipal = Annotated[Principal, Depends(authenticate)]


async def current_tenant(principal: CurrentPrincipal) -> TenantRef:
    return principal.tenant


CurrentTenant = Annotated[TenantRef, Depends(current_tenant)]


def owned_job(
    job_id: Annotated[str, Path(description="A job id (job_...).", max_length=64)],
    tenant: CurrentTenant,
    session: SessionDep,
) -> Job:
    job = repository.get_job(session, tenant.id, job_id)
    if job is None:
        raise NotFound(f"no job with id {job_id!r}", param="job_id")
    return job


OwnedJob = Annotated[Job, Depends(owned_job)]


async def visible_job(
    job_id: Annotated[str, Path(description="A job id (job_...).", max_length=64)],
    tenant: CurrentTenant,
    services: ServicesDep,
) -> JobLike:
    """The caller's job, read-only (for routes that only read it): one autocommit statement, awaited on the
    event loop (PostgreSQL; SQLite runs it in the thread pool)."""
    job = await repository.read_job(services.db.async_pool, tenant.id, job_id)
    if job is None:
        raise NotFound(f"no job with id {job_id!r}", param="job_id")
    return job


VisibleJob = Annotated[JobLike, Depends(visible_job)]


async def owned_file(
    file_id: Annotated[str, Path(description="A file id (file_...).", max_length=64)],
    tenant: CurrentTenant,
    services: ServicesDep,
) -> FileLike:
    row = await repository.get_file(services.db.async_pool, tenant.id, file_id)
    if row is None:
        raise NotFound(f"no file with id {file_id!r}", param="file_id")
    return row


OwnedFile = Annotated[FileLike, Depends(owned_file)]


def owned_checkpoint(
    checkpoint_id: Annotated[str, Path(description="A checkpoint id (ckpt_...).", max_length=64)],
    job: OwnedJob,
    session: SessionDep,
) -> Checkpoint:
    ckpt = repository.get_checkpoint(session, job.id, checkpoint_id)
    if ckpt is None:
        raise NotFound(f"no checkpoint with id {checkpoint_id!r} in job {job.id}", param="checkpoint_id")
    return ckpt


OwnedCheckpoint = Annotated[Checkpoint, Depends(owned_checkpoint)]
