"""JSONL datasets: upload (streamed, size-limited, checked line by line), list, get, download, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from service import views
from service.dependencies import CurrentTenant, OwnedFile, ServicesDep, SessionDep
from service.errors import NotFound
from service.schemas import AUTHENTICATED_ERRORS, Deleted, FileList, FileObject, FilePurpose, errors
from service.services import Services
from service.storage import attachment, stored_bytes
from service.uploads import (
    check_declared_length,
    check_reasoning_gym_configs,
    invalid_file,
    multipart_boundary,
    receive_upload,
    validate_jsonl,
)
from store import repository
from store.ids import new_id
from store.models import FILE_PURPOSES, File

router = APIRouter(prefix="/v1/files", tags=["files"], responses=AUTHENTICATED_ERRORS)

UPLOAD_BODY = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file"],
                "properties": {
                    "file": {
                        "type": "string",
                        "format": "binary",
                        "description": 'JSONL: one {"prompt": str, "answer": str, "meta"?: object} per line; '
                        'a reasoning-gym meta is {"reasoning_gym": {task, config, seed, size, index}}.',
                    },
                    "purpose": {"type": "string", "enum": list(FILE_PURPOSES), "default": "rl_train"},
                },
            }
        }
    },
}


@router.post(
    "",
    summary="Upload a JSONL dataset",
    status_code=201,
    response_model=FileObject,
    responses=errors(400, 415, 507),
    openapi_extra={"requestBody": UPLOAD_BODY},
)
async def upload_file(
    request: Request, tenant: CurrentTenant, session: SessionDep, services: ServicesDep
) -> FileObject:
    """Upload a training file as multipart/form-data (`file`, optional `purpose`). The body is streamed to
    disk and cut off at the size limit (413). Every line must be a UTF-8 JSON object with non-empty string
    fields `prompt` and `answer` (and an optional object `meta`, no other key); otherwise 422 says how many
    lines fail and why, grouped by kind with the fix, and lists the first problems with their line numbers.
    Nothing is stored for a rejected upload, nor when the storage fails while writing it (507 when full, 503
    otherwise)."""
    session.close()  # hold no database connection while the body streams in
    settings = services.settings
    boundary = multipart_boundary(request.headers.get("content-type"))
    check_declared_length(request.headers.get("content-length"), settings.max_upload_bytes)
    file_id = new_id("file")
    key = f"{tenant.id}/files/{file_id}.jsonl"
    with services.storage.staged(key) as staged:
        received = await receive_upload(
            request.stream(), boundary, staged, max_bytes=settings.max_upload_bytes
        )
        records, problems = await run_in_threadpool(
            validate_jsonl,
            staged,
            max_line_bytes=settings.max_line_bytes,
            max_errors=settings.max_file_errors,
        )
        if problems:
            raise invalid_file(problems)
        config_problems = await check_reasoning_gym_configs(
            staged, services.offload, max_line_bytes=settings.max_line_bytes, tenant=tenant.id
        )
        if config_problems:
            raise invalid_file(config_problems)
        await run_in_threadpool(services.storage.commit, staged, key)
    try:
        row = await run_in_threadpool(
            _insert_file,
            services,
            file_id=file_id,
            tenant_id=tenant.id,
            filename=received.filename,
            purpose=received.purpose,
            size=received.size,
            sha256=received.sha256,
            records=records,
            storage_key=key,
        )
    except BaseException:
        services.storage.delete(key)
        raise
    return views.file_view(row)


def _insert_file(services: Services, **values: object) -> File:
    with services.db.transaction() as session:
        return repository.create_file(session, **values)  # type: ignore[arg-type]


@router.get("", summary="List files", response_model=FileList)
def list_files(
    tenant: CurrentTenant,
    session: SessionDep,
    after: Annotated[
        str | None, Query(description="The last file id of the previous page.", max_length=64)
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    purpose: FilePurpose | None = None,
) -> FileList:
    """This tenant's files, newest first."""
    rows, has_more = repository.list_files(session, tenant.id, after=after, limit=limit, purpose=purpose)
    return FileList(
        data=[views.file_view(r) for r in rows],
        has_more=has_more,
        first_id=rows[0].id if rows else None,
        last_id=rows[-1].id if rows else None,
    )


@router.get("/{file_id}", summary="Get a file", response_model=FileObject, responses=errors(404))
async def get_file(file: OwnedFile) -> FileObject:
    return views.file_view(file)


@router.get(
    "/{file_id}/content",
    summary="Download a file's content",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/jsonl": {"schema": {"type": "string"}}}}, **errors(404)},
)
def get_file_content(file: OwnedFile, services: ServicesDep) -> StreamingResponse:
    storage, key = services.storage, file.storage_key
    if not storage.exists(key):
        raise NotFound(f"the content of file {file.id} is missing from storage", param="file_id")
    return StreamingResponse(
        stored_bytes(storage, key),
        media_type="application/jsonl",
        headers={"Content-Length": str(storage.size(key)), "Content-Disposition": attachment(file.filename)},
    )


@router.delete("/{file_id}", summary="Delete a file", response_model=Deleted, responses=errors(404, 409))
def delete_file(file: OwnedFile, session: SessionDep, services: ServicesDep) -> Deleted:
    """Delete the file and its content. 409 while a job that has not finished uses it."""
    repository.delete_file(session, file)
    session.commit()
    services.storage.delete(file.storage_key)
    return Deleted(id=file.id, object="file")
