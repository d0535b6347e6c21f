"""Base models a job may name."""

from __future__ import annotations

from fastapi import APIRouter

from service.dependencies import CurrentTenant, ServicesDep
from service.schemas import AUTHENTICATED_ERRORS, ModelList, ModelObject

router = APIRouter(prefix="/v1/models", tags=["catalogue"], responses=AUTHENTICATED_ERRORS)


@router.get("", summary="List base models", response_model=ModelList)
def list_models(_: CurrentTenant, services: ServicesDep) -> ModelList:
    """The trainer's built-in models and the ones this server's operator configured; put an id in
    `spec.model.name`."""
    return ModelList(
        data=[
            ModelObject(id=name, description=description, builtin=builtin)
            for name, (description, builtin) in sorted(services.models.items())
        ]
    )
