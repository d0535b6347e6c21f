"""Request dependencies, named for what they give a route: SessionDep, CurrentCaller, CurrentPrincipal,
CurrentTenant, PageCaller (the pages: None when not signed in), OwnedJob (to change it), VisibleJob (to read
it), OwnedFile, OwnedCheckpoint. Authentication, rate limiting and the ownership checks live here and nowhere
else: a route that takes OwnedJob only ever sees the caller's own job (another tenant's is a 404).

Authentication is one function for every route (`_identify`): a Bearer API key, or the job page's session
cookie (service.sessions), which then needs the X-CSRF-Token header on every unsafe method. Both resolve to
the key's principal through the same cache (service.principals), record the key's use the same way and spend
a token of the same rate bucket, so the page's scripts call the /v1 routes exactly as an API client does.

Dependencies that use a SQLAlchemy session are plain functions (FastAPI runs them in its thread pool); the
ones that do not are `async def`, so they cost no thread hop. VisibleJob awaits its one statement on the
database's event-loop pool (store.async_pool), and so does OwnedFile.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, get_args, get_origin

from fastapi import Depends, Header, Path, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from fastapi.security import APIKeyCookie, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.types import Scope

from service.errors import Forbidden, NotFound, TooManyRequests, Unauthenticated, Unprocessable
from service.principals import Principal, TenantRef
from service.ratelimit import retry_after_seconds
from service.services import Services
from service.sessions import COOKIE_NAME, CSRF_HEADER, SAFE_METHODS, SessionSigner
from service.sessions import Session as PageSession
from service.views import FileLike, JobLike
from store import repository
from store.models import ApiKey, Checkpoint, Job, Tenant

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="An API key: `Authorization: Bearer sk-stare-...` (create one with `python -m service create-tenant`).",
)
session_cookie = APIKeyCookie(
    name=COOKIE_NAME,
    auto_error=False,
    scheme_name="Session",
    description="The job page's sign-in session (POST /ui/session), for the page's own scripts: HttpOnly, "
    "SameSite=Strict; writes need the header X-CSRF-Token too.",
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


def _verified(session: Session, key: ApiKey, tenant: Tenant) -> tuple[Principal, str]:
    """The key's principal and stored hash, its use recorded (at most once a minute, store.repository)."""
    if repository.touch_api_key(session, key):
        session.commit()
    return Principal.of(key, tenant), key.key_hash


def _look_up_key(services: Services, presented: str) -> tuple[Principal, str] | None:
    with services.db.sessions() as session:
        found = repository.find_api_key(session, presented)
        return _verified(session, *found) if found is not None else None


def _look_up_session(services: Services, page: PageSession) -> tuple[Principal, str] | None:
    with services.db.sessions() as session:
        key = repository.get_api_key(session, page.tenant_id, page.key_id)
        tenant = repository.get_tenant(session, page.tenant_id) if key is not None else None
        return _verified(session, key, tenant) if key is not None and tenant is not None else None


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the principal and, when the page's session cookie (not a Bearer key)
    authenticated it, the CSRF token the page embeds for that session."""

    principal: Principal
    csrf_token: str | None = None


def session_signer(request: Request) -> SessionSigner:
    signer: SessionSigner = request.app.state.session_signer  # built by create_app
    return signer


CSRF_MAX_CHARS = 200
CsrfHeader = Annotated[
    str | None,
    Header(
        alias=CSRF_HEADER,
        max_length=CSRF_MAX_CHARS,
        description="Only with the job page's session cookie, on every method but GET/HEAD/OPTIONS: the "
        "token the page embeds. Bearer requests never need it.",
    ),
]


CALLER_STATE = "stare_caller"  # scope["state"][...]: the caller the request boundary authenticated


async def _identify(
    request: Request,
    services: Services,
    credentials: HTTPAuthorizationCredentials | None,
    cookie: str | None,
    csrf: str | None,
    *,
    required: bool,
) -> Caller | None:
    """The one authentication of every route: `Authorization: Bearer <key>` when the header is there,
    else the session cookie; then the key's principal (cached, service.principals), a CSRF check for a
    cookie's unsafe methods, and one token of the key's rate bucket. A missing or failed cookie is a 401
    when `required`, else None (the pages send the browser to sign in). A /v1 request was authenticated
    by the request boundary before its body was read (`authenticate_scope`): its caller is taken as is."""
    done = request.scope.get("state", {}).get(CALLER_STATE)
    if isinstance(done, Caller):
        return done
    address = client_address(request.scope)
    if "authorization" in request.headers:
        if credentials is None or not credentials.credentials:
            await spend_address_token(services, address)
            raise Unauthenticated(
                "no API key: send the header 'Authorization: Bearer <key>'", code="missing_api_key"
            )
        principal = await key_principal(services, credentials.credentials.strip(), address=address)
        caller = Caller(principal)
    else:
        signer = session_signer(request)
        page = signer.verify(cookie)
        if page is None or services.principals.get_by_key_id(page.key_id, page.tenant_id) is None:
            await spend_address_token(services, address)  # a failed or uncached sign-in costs the address
        found = await _session_principal(services, page) if page is not None else None
        if page is None or found is None or found.key.revoked_at is not None:
            if not required:
                return None
            raise _session_refused(cookie, found)
        caller = Caller(found, signer.csrf_token(page))
        if request.method not in SAFE_METHODS and not signer.csrf_ok(page, csrf):
            raise Forbidden(f"missing or wrong {CSRF_HEADER} header", param=CSRF_HEADER, code="csrf_failed")
    await spend_rate_token(services, caller.principal)
    return caller


async def authenticate_scope(services: Services, scope: Scope) -> Caller:
    """The request boundary's authentication of a /v1 request, from its headers alone (the body is not read
    yet): the same rules as `authenticate`, kept in scope["state"] for it. Raises Unauthenticated, Forbidden
    or TooManyRequests (issue 44, R3: no body is parsed for a caller who is not one)."""
    request = Request(scope)
    bearer_value = request.headers.get("authorization")
    credentials = None
    if bearer_value is not None:
        scheme, _, token = bearer_value.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            credentials = HTTPAuthorizationCredentials(scheme=scheme, credentials=token.strip())
    cookie = request.cookies.get(COOKIE_NAME)
    csrf = request.headers.get(CSRF_HEADER)
    if csrf is not None and len(csrf) > CSRF_MAX_CHARS:  # as the route's header parameter would say
        raise Unprocessable(
            f"{CSRF_HEADER}: at most {CSRF_MAX_CHARS} characters", param=CSRF_HEADER, code="invalid_request"
        )
    caller = await _identify(request, services, credentials, cookie, csrf, required=True)
    assert caller is not None
    scope.setdefault("state", {})[CALLER_STATE] = caller
    return caller


def client_address(scope: Scope) -> str:
    """The peer's address (behind a proxy, run uvicorn with --proxy-headers so it is the client's)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


async def spend_address_token(services: Services, address: str) -> None:
    """One token of the source address's bucket, spent by every request that does not (yet) prove a key: no
    credentials, a key or session not in the principal cache (its lookup), a wrong one (the 401). So wrong
    keys sent from one address meet a 429 after `address_rate_limit_burst`, before any lookup."""
    wait_s = await services.address_limiter.acquire_async(address)
    if wait_s > 0:
        raise TooManyRequests(
            f"rate limit of {services.settings.address_rate_limit_per_second:g} unauthenticated requests/s "
            "per source address exceeded; retry later",
            retry_after_s=retry_after_seconds(wait_s),
            code="address_rate_limit_exceeded",
        )


async def spend_rate_token(services: Services, principal: Principal) -> None:
    """One token of the key's rate bucket, then one of the tenant's (service.ratelimit): a tenant's keys share
    the tenant's rate, however many it mints. Else 429 with Retry-After, naming the limit."""
    settings = services.settings
    wait_s = await services.limiter.acquire_async(principal.key.id)
    if wait_s > 0:
        raise TooManyRequests(
            f"rate limit of {settings.rate_limit_per_second:g} requests/s per key exceeded; retry later",
            retry_after_s=retry_after_seconds(wait_s),
        )
    wait_s = await services.tenant_limiter.acquire_async(principal.tenant.id)
    if wait_s > 0:
        raise TooManyRequests(
            f"rate limit of {settings.tenant_rate_limit_per_second:g} requests/s per tenant (all its keys "
            "together) exceeded; retry later",
            retry_after_s=retry_after_seconds(wait_s),
        )


def _session_refused(cookie: str | None, principal: Principal | None) -> Unauthenticated:
    if cookie is None:
        return Unauthenticated(
            "no API key: send the header 'Authorization: Bearer <key>' (or sign in at /ui/sign-in)",
            code="missing_api_key",
        )
    if principal is not None:
        return Unauthenticated("the API key of this session was revoked", code="api_key_revoked")
    return Unauthenticated("the session has expired or is not valid: sign in again", code="invalid_session")


async def key_principal(services: Services, presented: str, *, address: str | None = None) -> Principal:
    """A presented API key's principal (cached), or Unauthenticated; sign-in (service.routers.pages) checks
    keys with it too. A key not in the cache spends a token of `address` before it is looked up."""
    principal = services.principals.get(presented)
    if principal is None:
        if address is not None:
            await spend_address_token(services, address)
        found = await run_in_threadpool(_look_up_key, services, presented)
        if found is None:
            raise Unauthenticated("invalid API key")
        principal, key_hash = found
        if principal.key.revoked_at is not None:
            raise Unauthenticated("this API key was revoked", code="api_key_revoked")
        services.principals.put(key_hash, principal)
    return principal


async def _session_principal(services: Services, page: PageSession) -> Principal | None:
    """The principal of the key a verified session names (cached like the key), revoked or not; None when
    the key or its tenant is gone."""
    principal = services.principals.get_by_key_id(page.key_id, page.tenant_id)
    if principal is None:
        found = await run_in_threadpool(_look_up_session, services, page)
        if found is None:
            return None
        principal, key_hash = found
        services.principals.put(key_hash, principal)  # the cache keeps no revoked key
    return principal


BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
SessionCookie = Annotated[str | None, Depends(session_cookie)]


async def authenticate(
    request: Request,
    services: ServicesDep,
    credentials: BearerCredentials,
    cookie: SessionCookie,
    csrf: CsrfHeader = None,
) -> Caller:
    """Every authenticated route's caller: a Bearer key, or the job page's session cookie (401 without)."""
    caller = await _identify(request, services, credentials, cookie, csrf, required=True)
    assert caller is not None
    return caller


CurrentCaller = Annotated[Caller, Depends(authenticate)]


async def page_caller(
    request: Request,
    services: ServicesDep,
    credentials: BearerCredentials,
    cookie: SessionCookie,
    csrf: CsrfHeader = None,
) -> Caller | None:
    """The pages' caller, by the same authentication: None when not signed in (the page redirects)."""
    return await _identify(request, services, credentials, cookie, csrf, required=False)


PageCaller = Annotated[Caller | None, Depends(page_caller)]


async def current_principal(caller: CurrentCaller) -> Principal:
    return caller.principal


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


async def current_tenant(caller: CurrentCaller) -> TenantRef:
    return caller.principal.tenant


CurrentTenant = Annotated[TenantRef, Depends(current_tenant)]


def tenant_job(session: Session, tenant: TenantRef, job_id: str) -> Job:
    """The tenant's job, or NotFound (another tenant's job is missing, never forbidden)."""
    job = repository.get_job(session, tenant.id, job_id)
    if job is None:
        raise NotFound(f"no job with id {job_id!r}", param="job_id")
    return job


def owned_job(
    job_id: Annotated[str, Path(description="A job id (job_...).", max_length=64)],
    tenant: CurrentTenant,
    session: SessionDep,
) -> Job:
    return tenant_job(session, tenant, job_id)


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
