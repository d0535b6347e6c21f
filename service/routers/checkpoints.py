"""A job's checkpoints: list, get, and download as a streamed tar with its SHA-256."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from contract.checkpointing import model_part
from service import views
from service.checkpoint_schemas import CheckpointList, CheckpointObject
from service.dependencies import OwnedCheckpoint, OwnedJob, ServicesDep, SessionDep
from service.errors import NotFound
from service.schemas import AUTHENTICATED_ERRORS, errors
from service.storage import archive_digest, checkpoint_archive, checkpoint_archive_name
from store import repository

router = APIRouter(
    prefix="/v1/jobs/{job_id}/checkpoints", tags=["checkpoints"], responses=AUTHENTICATED_ERRORS
)


@router.get("", summary="List a job's checkpoints", response_model=CheckpointList, responses=errors(404))
def list_checkpoints(job: OwnedJob, session: SessionDep) -> CheckpointList:
    """Complete checkpoints, oldest first, each with the training metrics of its step."""
    rows = repository.list_checkpoints(session, job.id)
    metrics = repository.metrics_at_steps(session, job.id, [r.step for r in rows])
    return CheckpointList(data=[views.checkpoint_view(r, metrics.get(r.step)) for r in rows])


@router.get(
    "/{checkpoint_id}", summary="Get a checkpoint", response_model=CheckpointObject, responses=errors(404)
)
def get_checkpoint(checkpoint: OwnedCheckpoint, session: SessionDep) -> CheckpointObject:
    metrics = repository.metrics_at_steps(session, checkpoint.job_id, [checkpoint.step])
    return views.checkpoint_view(checkpoint, metrics.get(checkpoint.step))


@router.get(
    "/{checkpoint_id}/download",
    summary="Download a checkpoint",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "A tar stream of the checkpoint folder (model/ or adapter/, and the training "
            "state where it was kept), or with `model_only=true` of model/ and adapter/ alone. "
            "`X-Content-SHA256` is the SHA-256 of the whole stream; `Content-Length` its size.",
            "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}},
        },
        **errors(404),
    },
)
def download_checkpoint(
    checkpoint: OwnedCheckpoint,
    job: OwnedJob,
    session: SessionDep,
    services: ServicesDep,
    model_only: Annotated[
        bool, Query(description="Only what users load: model/ (weights, config, tokenizer) and adapter/.")
    ] = False,
) -> StreamingResponse:
    """Stream the checkpoint as a tar. The folder comes from the checkpoint's row (never from the request),
    must lie inside the job's own folder, and is resolved and checked to stay inside the artifact root;
    symlinks are never followed. A model-only archive's digest is computed at each request (the row keeps
    the whole folder's)."""
    if not checkpoint.path.startswith(f"{job.tenant_id}/{job.id}/"):
        raise NotFound(f"checkpoint {checkpoint.id} has no files", param="checkpoint_id")
    files = services.storage.walk(checkpoint.path)
    top = checkpoint_archive_name(job.id, checkpoint.step)
    sha256, size = checkpoint.archive_sha256, checkpoint.archive_bytes
    if model_only:
        files = [f for f in files if model_part(f.relative)]
        if not files:
            raise NotFound(f"checkpoint {checkpoint.id} has no model/ or adapter/", param="model_only")
        sha256, size = archive_digest(services.storage, files, top)
    elif sha256 is None or size is None:
        # Once per checkpoint; stored for the next download.
        sha256, size = archive_digest(services.storage, files, top)
        repository.set_checkpoint_archive(session, checkpoint, sha256, size)
        session.commit()
    session.close()
    return StreamingResponse(
        checkpoint_archive(services.storage, files, top),
        media_type="application/x-tar",
        headers={
            "Content-Disposition": f'attachment; filename="{top}.tar"',
            "Content-Length": str(size),
            "X-Content-SHA256": sha256,
            "ETag": f'"{sha256}"',
        },
    )
