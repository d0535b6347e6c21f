"""The caller: tenant, key, limits and usage."""

from __future__ import annotations

from fastapi import APIRouter

from service import views
from service.dependencies import CurrentPrincipal, ServicesDep, SessionDep
from service.schemas import AUTHENTICATED_ERRORS, Limits, Me, Usage
from store import repository

router = APIRouter(prefix="/v1", tags=["identity"], responses=AUTHENTICATED_ERRORS)


@router.get("/me", summary="Who am I", response_model=Me)
def me(principal: CurrentPrincipal, session: SessionDep, services: ServicesDep) -> Me:
    """The tenant and key behind this request, the tenant's limits and its current usage."""
    settings = services.settings
    usage = repository.tenant_usage(session, principal.tenant.id)
    return Me(
        tenant=views.tenant_view(principal.tenant),
        api_key=views.api_key_view(principal.key),
        limits=Limits(
            max_active_jobs=settings.max_active_jobs_per_tenant or None,
            max_upload_bytes=settings.max_upload_bytes,
            rate_limit_per_second=settings.rate_limit_per_second or None,
            rate_limit_burst=settings.rate_limit_burst,
            tenant_rate_limit_per_second=settings.tenant_rate_limit_per_second or None,
            tenant_rate_limit_burst=settings.tenant_rate_limit_burst,
            max_active_api_keys=settings.max_active_keys_per_tenant or None,
        ),
        usage=Usage(
            active_jobs=usage.active_jobs, jobs=usage.jobs, files=usage.files, file_bytes=usage.file_bytes
        ),
    )
