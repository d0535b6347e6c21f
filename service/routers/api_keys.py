"""API keys of the caller's tenant: create (the secret is shown once), list, revoke."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from service import views
from service.dependencies import CurrentTenant, ServicesDep, SessionDep
from service.errors import NotFound
from service.schemas import (
    AUTHENTICATED_ERRORS,
    ApiKeyCreate,
    ApiKeyCreated,
    ApiKeyList,
    ApiKeyObject,
    errors,
)
from store import repository

router = APIRouter(prefix="/v1/api-keys", tags=["identity"], responses=AUTHENTICATED_ERRORS)


@router.post(
    "",
    summary="Create an API key",
    status_code=201,
    response_model=ApiKeyCreated,
    responses=errors(409),
)
def create_api_key(
    body: ApiKeyCreate, tenant: CurrentTenant, session: SessionDep, services: ServicesDep
) -> ApiKeyCreated:
    """A new key for this tenant. The response holds the secret; it is stored only as a SHA-256 hash. A tenant
    has at most `limits.max_active_api_keys` active keys (GET /v1/me): past it, 409 too_many_api_keys."""
    cap = services.settings.max_active_keys_per_tenant
    key, secret = repository.create_api_key(session, tenant.id, body.name, max_active=cap)
    session.commit()
    return ApiKeyCreated(**views.api_key_view(key).model_dump(), key=secret)


@router.get("", summary="List API keys", response_model=ApiKeyList)
def list_api_keys(tenant: CurrentTenant, session: SessionDep) -> ApiKeyList:
    """Every key of this tenant, revoked ones included (prefixes only, never secrets)."""
    return ApiKeyList(data=[views.api_key_view(k) for k in repository.list_api_keys(session, tenant.id)])


@router.delete(
    "/{key_id}", summary="Revoke an API key", response_model=ApiKeyObject, responses=errors(404, 409)
)
def revoke_api_key(
    key_id: Annotated[str, Path(description="An API key id (key_...).", max_length=64)],
    tenant: CurrentTenant,
    session: SessionDep,
    services: ServicesDep,
) -> ApiKeyObject:
    """Revoke a key at once; requests with it get 401 from then on. The tenant's last active key cannot be
    revoked (409): create a new one first."""
    key = repository.get_api_key(session, tenant.id, key_id)
    if key is None:
        raise NotFound(f"no API key with id {key_id!r}", param="key_id")
    repository.revoke_api_key(session, key)
    session.commit()
    services.principals.forget(key.prefix)
    return views.api_key_view(key)
