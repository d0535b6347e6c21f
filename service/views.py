"""Rows to API objects: the job's progress, ETA and entropy status are derived here, from the job row alone."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, Literal

from pydantic import ValidationError
from sqlalchemy.engine import Row

from contract import algorithms
from contract import control as controllers
from contract.control import pi as cm
from contract.metrics import (
    BAND_HIGH,
    BAND_LOW,
    BAND_STATE,
    COLLAPSE_STEP,
    ENTROPY,
    POST_GATE_STEPS,
    STEPS_OUT_OF_BAND,
    TARGET_ENTROPY,
    TARGET_HOLD_FRACTION,
    BandState,
)
from contract.numbers import finite
from service import schemas
from service.checkpoint_schemas import CheckpointObject
from service.principals import KeyRef, TenantRef
from store.models import TERMINAL_STATUSES, WAITING_STATUSES, ApiKey, Checkpoint, File, Job, JobEvent, Tenant

# A Job, or a read-only row of the same columns under the same names (store.repository.read_job).
JobLike = Job | Row[Any] | SimpleNamespace
# A File, or a read-only row of its columns (repository.get_file).
FileLike = File | SimpleNamespace


def metric_values(metrics: Mapping[str, Any] | None) -> dict[str, float | None]:
    """Numeric metrics only (a non-finite value was stored as null and stays null; a flag reads 0 or 1)."""
    if not metrics:
        return {}
    return {
        str(k): float(v) if isinstance(v, bool) else finite(v)
        for k, v in metrics.items()
        if v is None or isinstance(v, int | float)
    }


def entropy_status(job: JobLike) -> schemas.EntropyStatus:
    metrics = job.last_metrics or {}
    band_spec = job.resolved_spec.get("entropy_band") if isinstance(job.resolved_spec, dict) else None
    band_spec = band_spec if isinstance(band_spec, dict) else {}
    value = finite(metrics.get(ENTROPY))
    low = finite(metrics.get(BAND_LOW))
    high = finite(metrics.get(BAND_HIGH))
    if low is None or high is None:
        low, high = finite(band_spec.get("low")), finite(band_spec.get("high"))
    state: str | None = None
    logged_state = finite(metrics.get(BAND_STATE))
    if logged_state is not None:
        state = BandState.from_code(logged_state).label
    elif value is not None and low is not None and high is not None:
        state = BandState.of(value, low, high).label
    out_of_band = finite(metrics.get(STEPS_OUT_OF_BAND))
    target_value = finite(metrics.get(TARGET_ENTROPY))
    target = None
    if target_value is not None:
        against: Literal["below", "at_or_above"] | None = None
        if value is not None:
            against = "below" if value < target_value else "at_or_above"
        target = schemas.EntropyTarget(value=target_value, state=against)
    collapse = finite(metrics.get(COLLAPSE_STEP))
    post_gate = finite(metrics.get(POST_GATE_STEPS))
    return schemas.EntropyStatus(
        value=value,
        band=schemas.EntropyBand(low=low, high=high),
        state=state,  # type: ignore[arg-type]
        steps_out_of_band=int(out_of_band) if out_of_band is not None else None,
        target=target,
        collapse_step=int(collapse) if collapse else None,  # the metric is 0 while not collapsed
        target_hold_fraction=finite(metrics.get(TARGET_HOLD_FRACTION)),
        post_gate_steps=int(post_gate) if post_gate is not None else None,
    )


def control_status(job: JobLike) -> schemas.ControlStatus | None:
    """The entropy law's output, error, integral and actuator from the latest step's metrics; None for a job
    whose algorithm is not a law and that has logged no law output."""
    metrics = job.last_metrics or {}
    if not _is_law(job.algorithm) and cm.OUTPUT not in metrics:
        return None
    flag = metrics.get(cm.SATURATED)
    at_clip = float(flag) if isinstance(flag, bool) else finite(flag)  # logged as 0/1 or a bool
    run = finite(metrics.get(cm.SATURATED_STEPS))
    steps = int(run) if run is not None else None
    return schemas.ControlStatus(
        law=job.algorithm,
        target=finite(metrics.get(cm.TARGET)),
        output=finite(metrics.get(cm.OUTPUT)),
        error=finite(metrics.get(cm.ERROR)),
        integral=finite(metrics.get(cm.INTEGRAL)),
        actuator=finite(metrics.get(cm.ACTUATOR)),
        at_clip=bool(at_clip) if at_clip is not None else None,
        saturated_steps=steps,
        saturated=cm.saturation_alert(steps, finite(metrics.get(cm.OUTPUT))),
    )


def _is_law(algorithm: str) -> bool:
    try:
        name = algorithms.get(algorithm).controller
    except ValueError:
        return False
    return name is not None and controllers.get(name).closed_loop


def progress(job: JobLike) -> schemas.Progress:
    total = max(job.total_steps, 1)
    step = min(job.current_step, job.total_steps)
    eta = None
    finish = None
    if job.status not in TERMINAL_STATUSES and job.step_seconds_ema is not None:
        eta = max(job.total_steps - job.current_step, 0) * job.step_seconds_ema
        if job.last_step_at is not None:
            finish = job.last_step_at + timedelta(seconds=eta)
    return schemas.Progress(
        step=step,
        total_steps=job.total_steps,
        fraction=min(step / total, 1.0),
        step_seconds=job.step_seconds_ema,
        eta_seconds=eta,
        estimated_finish=finish,
    )


def waiting(
    job: JobLike, served_queues: Collection[str] | None, behind_cancelling: bool = False
) -> schemas.JobWaiting | None:
    """Why the job waits, when it waits for a worker (queued, recovering) and no live worker serves its
    queue (`served_queues`: service.fleet.Fleet.served_queues; None: not known, nothing said), or when a job
    of its queue is cancelling (`behind_cancelling`: its worker is busy until that trainer has stopped)."""
    if job.status not in WAITING_STATUSES:
        return None
    if served_queues is None or job.queue in served_queues:
        if not behind_cancelling:
            return None
        message = "queued behind a job that is cancelling: it starts once that job's trainer has stopped"
        return schemas.JobWaiting(code="behind_cancelling", queue=job.queue, message=message)
    return schemas.JobWaiting(
        code="no_live_worker", queue=job.queue, message=f"no live worker serves queue '{job.queue}'"
    )


def grader_status(job: JobLike, warnings: list[dict[str, Any]] | None = None) -> schemas.GraderStatus | None:
    """A job with a grader: what it is, the latest step's grader/* metrics and the warnings given."""
    spec = job.resolved_spec if isinstance(job.resolved_spec, dict) else {}
    grader = spec.get("grader")
    if not isinstance(grader, dict):
        return None
    health = {k: v for k, v in metric_values(job.last_metrics).items() if k.startswith("grader/")}
    return schemas.GraderStatus(
        type=str(grader.get("type")), name=grader.get("name"), health=health, warnings=warnings
    )


def shown_warnings(found: list[dict[str, Any]]) -> list[schemas.JobWarning]:
    """The warnings as the API shows them; one the schema does not know (a kind of a newer server, written
    into a stored event) is left out rather than failing the view."""
    shown = []
    for warning in found:
        try:
            shown.append(schemas.JobWarning.model_validate(warning))
        except ValidationError:
            continue
    return shown


def job_view(
    job: JobLike,
    served_queues: Collection[str] | None = None,
    grader_warnings: list[dict[str, Any]] | None = None,
    warnings: list[dict[str, Any]] | None = None,
    samples: dict[str, Any] | None = None,
    *,
    disk_bytes: int | None = None,
    behind_cancelling: bool = False,
) -> schemas.JobObject:
    """The API's job object; with the queues live workers serve, a waiting job also says why it waits (and,
    where known, that it waits behind a cancelling job); a job with a grader carries its health and, where
    given, its loophole warnings; `warnings` and `samples` (store.repository.JobNotes) where given;
    `disk_bytes`, where given, what its files take on the server."""
    error = None
    if job.error_code is not None or job.error_message is not None:
        error = schemas.JobError(
            code=job.error_code or "error",
            message=job.error_message or "",
            param=job.error_param,
            category=job.error_category,  # type: ignore[arg-type]
        )
    latest = None
    if job.last_metrics is not None:
        latest = schemas.LatestMetrics(
            step=job.current_step, at=job.last_step_at, values=metric_values(job.last_metrics)
        )
    return schemas.JobObject(
        id=job.id,
        name=job.name,
        status=job.status,  # type: ignore[arg-type]
        model=job.model,
        algorithm=job.algorithm,
        queue=job.queue,
        training_file=job.training_file_id,
        metadata=dict(job.job_metadata or {}),
        created_at=job.created_at,
        updated_at=job.updated_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        failures=job.failures,
        lost_workers=job.lost_workers,
        max_lost_workers=job.max_lost_workers,
        progress=progress(job),
        entropy=entropy_status(job),
        control=control_status(job),
        latest_metrics=latest,
        error=error,
        waiting=waiting(job, served_queues, behind_cancelling),
        spec=job.resolved_spec,
        disk_bytes=disk_bytes,
        grader=grader_status(job, grader_warnings),
        warnings=shown_warnings(warnings or []),
        samples=schemas.JobSamples.model_validate(samples) if samples else None,
    )


def file_view(row: FileLike) -> schemas.FileObject:
    return schemas.FileObject(
        id=row.id,
        filename=row.filename,
        purpose=row.purpose,  # type: ignore[arg-type]
        bytes=row.bytes,
        sha256=row.sha256,
        records=row.records,
        created_at=row.created_at,
    )


def api_key_view(key: ApiKey | KeyRef) -> schemas.ApiKeyObject:
    return schemas.ApiKeyObject(
        id=key.id,
        name=key.name,
        prefix=key.prefix,
        created_at=key.created_at,
        last_used_at=key.last_used_at,
        revoked_at=key.revoked_at,
    )


def tenant_view(tenant: Tenant | TenantRef) -> schemas.TenantObject:
    return schemas.TenantObject(id=tenant.id, name=tenant.name, created_at=tenant.created_at)


def event_view(event: JobEvent) -> schemas.EventObject:
    return schemas.EventObject(
        id=event.seq,
        job_id=event.job_id,
        type=event.type,
        level=event.level,  # type: ignore[arg-type]
        message=event.message,
        step=event.step,
        data=event.data,
        created_at=event.created_at,
    )


def checkpoint_view(ckpt: Checkpoint, metrics: Mapping[str, Any] | None) -> CheckpointObject:
    return CheckpointObject(
        id=ckpt.id,
        job_id=ckpt.job_id,
        step=ckpt.step,
        created_at=ckpt.created_at,
        bytes=ckpt.bytes,
        sha256=ckpt.archive_sha256,
        metrics=metric_values(metrics) if metrics is not None else None,
        download_url=f"/v1/jobs/{ckpt.job_id}/checkpoints/{ckpt.id}/download",
    )
