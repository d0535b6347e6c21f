"""Training jobs: estimate, create (Idempotency-Key), list, get, cancel, pause, resume, delete."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from starlette.concurrency import run_in_threadpool

from contract.estimate import estimate
from contract.fleet import JobPlacement
from contract.graders import GradingSpec
from contract.spec import TrainSpec
from service import grading, job_specs, views
from service.dependencies import CurrentTenant, OwnedJob, ServicesDep, SessionDep, VisibleJob
from service.errors import TooManyRequests, Unprocessable
from service.fleet import blocks, place_job, served_queues
from service.job_warnings import job_warnings
from service.principals import TenantRef
from service.responses import model_response
from service.schemas import (
    AUTHENTICATED_ERRORS,
    Deleted,
    EstimateObject,
    JobCreate,
    JobList,
    JobObject,
    JobStatus,
    errors,
)
from service.services import Services
from service.settings import Settings
from service.storage import job_bytes
from service.views import FileLike
from store import repository
from store.models import WAITING_STATUSES

REPLAYED = {"Idempotent-Replayed": "true"}

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=AUTHENTICATED_ERRORS)

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        description="Retry-safe creation: the same key with the same body returns the job it created.",
    ),
]


def _checked_spec(body: JobCreate, training_file: FileLike | None, services: Services) -> TrainSpec:
    """The request's TrainSpec, or Unprocessable; `training_file` is the tenant's file named by the body
    (None when it names none, or one the tenant does not have)."""
    if body.training_file is not None:
        if training_file is None:
            raise Unprocessable(
                f"no file with id {body.training_file!r}", param="training_file", code="unknown_file"
            )
        if training_file.purpose != "rl_train":
            raise Unprocessable(
                f"file {training_file.id} has purpose {training_file.purpose!r}, not 'rl_train'",
                param="training_file",
            )
    return job_specs.validate_spec(
        body.spec,
        training_file=training_file,
        models=services.models,
        tool_limits=services.settings.tool_limits(),
    )


async def _validated(
    body: JobCreate, tenant: TenantRef, services: Services
) -> tuple[TrainSpec, JobPlacement]:
    """The request's TrainSpec and where it goes (a worker class that can run it), or Unprocessable."""
    training_file = None
    if body.training_file is not None:
        training_file = await repository.get_file(services.db.async_pool, tenant.id, body.training_file)
    # Validation is CPU work (pydantic, the task catalogue's import): off the loop; generation in a child.
    spec = await run_in_threadpool(_checked_spec, body, training_file, services)
    await job_specs.check_generation(spec, services.offload, tenant=tenant.id)
    args = (spec, body.spec, services.fleet, services.storage)
    placement = (
        await run_in_threadpool(place_job, *args) if blocks(spec, services.fleet) else place_job(*args)
    )
    return spec, placement


def _check_active_job_limit(settings: Settings, active: int) -> None:
    if active >= settings.max_active_jobs_per_tenant:
        raise TooManyRequests(
            f"the tenant has {active} jobs that have not finished (limit {settings.max_active_jobs_per_tenant})",
            retry_after_s=60,
            code="active_job_limit",
        )


def _request_hash(body: JobCreate, idempotency_key: str | None) -> str | None:
    """What a replay must match: the hash of the whole request body (only kept with an Idempotency-Key)."""
    return job_specs.canonical_hash(body.model_dump(mode="json")) if idempotency_key is not None else None


def _new_job(
    body: JobCreate,
    tenant: TenantRef,
    spec: TrainSpec,
    queue: str,
    settings: Settings,
    idempotency_key: str | None,
    request_hash: str | None,
) -> repository.NewJob:
    resolved = spec.resolved()
    return repository.NewJob(
        tenant_id=tenant.id,
        name=spec.name,
        spec=body.spec,
        resolved_spec=resolved,
        spec_hash=job_specs.canonical_hash(resolved),
        model=spec.model.name,
        algorithm=spec.algorithm.name,
        queue=queue,
        training_file_id=body.training_file,
        metadata=dict(body.metadata or {}),
        total_steps=spec.optim.steps,
        max_attempts=settings.max_attempts,
        max_lost_workers=settings.max_lost_workers,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
    )


@router.post("/estimate", summary="Validate a job and estimate its cost", response_model=EstimateObject)
async def estimate_job(body: JobCreate, tenant: CurrentTenant, services: ServicesDep) -> EstimateObject:
    """Everything POST /v1/jobs checks, without creating the job: the resolved spec (every default filled
    in), its cost in steps, sampled responses and tokens, its memory per device, the queue and worker class
    it would run on (422 exceeds_capacity when none can), and whether the tenant's limits let it start."""
    spec, placement = await _validated(body, tenant, services)
    cost = estimate(spec, placement.memory)
    pool, queue = services.db.async_pool, placement.queue
    limit = services.settings.max_active_jobs_per_tenant
    active = await repository.count_active_jobs(pool, tenant.id)
    return EstimateObject(
        resolved_spec=spec.resolved(),
        queue=queue,
        worker_class=placement.offer.label,
        jobs_ahead=await repository.count_queued(pool, queue),
        allowed_to_proceed=not limit or active < limit,
        active_jobs=active,
        max_active_jobs=limit or None,
        warnings=views.shown_warnings(await job_warnings(spec, services.storage)),
        **cost.model_dump(),
    )


@router.post(
    "",
    summary="Create a job",
    status_code=201,
    response_model=JobObject,
    responses={
        201: {"description": "The job, committed and queued. A replay adds `Idempotent-Replayed: true`."}
    },
)
async def create_job(
    body: JobCreate,
    tenant: CurrentTenant,
    services: ServicesDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Validate the spec (422 names the offending field), store the job, and queue it. A 201 means the job
    is committed: it will run even if the queue's broker loses the message. With an Idempotency-Key, a
    retried request returns the job the first one created; reusing a key for a different body is a 422."""
    pool = services.db.async_pool  # every statement awaited (store.async_pool); the job in one statement
    request_hash = _request_hash(body, idempotency_key)
    if idempotency_key is not None:
        existing = await repository.find_job_by_idempotency_key(
            pool, tenant.id, idempotency_key, request_hash
        )
        if existing is not None:
            queues = await served_queues(services.fleet)
            return model_response(views.job_view(existing, queues), 201, headers=REPLAYED)
    spec, placement = await _validated(body, tenant, services)
    settings = services.settings
    if settings.max_active_jobs_per_tenant:
        _check_active_job_limit(settings, await repository.count_active_jobs(pool, tenant.id))
    new = _new_job(body, tenant, spec, placement.queue, settings, idempotency_key, request_hash)
    new = dataclasses.replace(new, warnings=await job_warnings(spec, services.storage))
    if spec.grader is not None:  # its source loads in the sandbox, and the loophole check's warnings are kept
        grading.limits_within(
            (spec.grading or GradingSpec()).limits, settings.grader_limits(), "spec.grading.limits"
        )
        key = spec.task.path if spec.task.source == "jsonl" else None
        findings = await grading.job_findings(spec, key, tenant.id, services)
        new = dataclasses.replace(new, grader_warnings=findings)
    job, created = await repository.create_job(pool, new)
    if created:  # committed, durably, by now
        await services.enqueue_async(job.id, job.queue)
    queues = await served_queues(services.fleet)
    view = views.job_view(job, queues, new.grader_warnings, new.warnings)
    return model_response(view, 201, headers=None if created else REPLAYED)


@router.get("", summary="List jobs", response_model=JobList)
def list_jobs(
    tenant: CurrentTenant,
    session: SessionDep,
    services: ServicesDep,
    after: Annotated[
        str | None, Query(description="The last job id of the previous page.", max_length=64)
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size.")] = 20,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this state.")] = None,
) -> JobList:
    """This tenant's jobs, newest first. Pass `last_id` of a page as `after` for the next one."""
    rows, has_more = repository.list_jobs(session, tenant.id, after=after, limit=limit, status=status)
    queues = services.fleet.served_queues()
    return JobList(
        data=[views.job_view(j, queues) for j in rows],
        has_more=has_more,
        first_id=rows[0].id if rows else None,
        last_id=rows[-1].id if rows else None,
    )


@router.get("/{job_id}", summary="Get a job", response_model=JobObject, responses=errors(404))
async def get_job(job: VisibleJob, services: ServicesDep) -> Response:
    """Status, progress (step of total, ETA), the latest step's metrics, the entropy status (value, band,
    in_band | below | above, steps out of band), for a job with a grader its health and loophole warnings,
    for a failed job the error with its category, for a queued job that no live worker can take or that
    waits behind a cancelling job, why it waits (`waiting`), the bytes its files take (`disk_bytes`); its
    warnings (at submission, and the trainer's latest of each kind) and its latest samples (the evaluation's
    and training's: prompts, completions, references, rewards)."""
    pool = services.db.async_pool
    notes = await repository.job_notes(pool, job.id)
    behind = job.status in WAITING_STATUSES and await repository.cancelling_in_queue(pool, job.queue)
    disk = await run_in_threadpool(job_bytes, services.storage, job.tenant_id, job.id)
    view = views.job_view(
        job,
        await served_queues(services.fleet),
        notes.grader_warnings,
        notes.warnings,
        notes.samples,
        disk_bytes=disk,
        behind_cancelling=behind,
    )
    return model_response(view)


@router.post("/{job_id}/cancel", summary="Cancel a job", response_model=JobObject, responses=errors(404, 409))
def cancel_job(job: OwnedJob, session: SessionDep, services: ServicesDep) -> JobObject:
    """A job that is not running is cancelled at once (a queued job never starts). A running job becomes
    `cancelling`: its worker stops at the next step and the job ends `cancelled`. 409 if it already
    succeeded or failed."""
    repository.request_cancel(session, job)
    session.commit()
    return views.job_view(job, services.fleet.served_queues())


@router.post("/{job_id}/pause", summary="Pause a job", response_model=JobObject, responses=errors(404, 409))
def pause_job(job: OwnedJob, session: SessionDep, services: ServicesDep) -> JobObject:
    """A queued job is paused at once. A running job becomes `pausing`: its worker writes a checkpoint and
    releases the job, which then is `paused`. Resume continues from that checkpoint."""
    repository.request_pause(session, job)
    session.commit()
    return views.job_view(job, services.fleet.served_queues())


@router.post(
    "/{job_id}/resume",
    summary="Resume a paused job, or one that failed on a system fault",
    response_model=JobObject,
    responses=errors(404, 409),
)
def resume_job(job: OwnedJob, session: SessionDep, services: ServicesDep) -> JobObject:
    """Queue a paused job again (it continues from its latest checkpoint), or withdraw a pause the worker
    has not acted on yet. A job that failed on a system fault (`error.category == "system"`: a full or
    read-only disk, a spent retry budget) is queued again the same way once the fault is fixed, with fresh
    retry budgets. 409 for any other job (`job_not_resumable` for a user error: submit a fixed job)."""
    if repository.resume_job(session, job):
        repository.mark_enqueued(session, [job.id])
        session.commit()
        services.enqueue(job.id, job.queue)
    else:
        session.commit()
    return views.job_view(job, services.fleet.served_queues())


@router.delete(
    "/{job_id}", summary="Delete a finished job", response_model=Deleted, responses=errors(404, 409)
)
def delete_job(job: OwnedJob, session: SessionDep, services: ServicesDep) -> Deleted:
    """Delete a succeeded, failed or cancelled job with its events, metrics, checkpoints and artifacts.
    409 for a job that has not finished (cancel it first)."""
    job_id, folder = job.id, f"{job.tenant_id}/{job.id}"
    repository.delete_job(session, job)
    session.commit()
    services.storage.delete(folder)
    return Deleted(id=job_id, object="job")
