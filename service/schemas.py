"""Request and response bodies of the HTTP API (the OpenAPI schema is generated from these)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema

from contract.estimate import JobEstimate
from service.error_schemas import ErrorResponse
from service.schemas_notes import JobSamples, JobWarning
from service.schemas_status import ControlStatus, EntropyBand, EntropyStatus, EntropyTarget
from store.ids import id_pattern
from store.models import FILE_PURPOSES, JobStatus

FilePurpose = Literal["rl_train", "rl_eval"]
assert set(FilePurpose.__args__) == set(FILE_PURPOSES)  # type: ignore[attr-defined]

JobId = Annotated[str, StringConstraints(pattern=id_pattern("job"))]
FileId = Annotated[str, StringConstraints(pattern=id_pattern("file"))]
KeyId = Annotated[str, StringConstraints(pattern=id_pattern("key"))]
CheckpointId = Annotated[str, StringConstraints(pattern=id_pattern("ckpt"))]
MetricValues = dict[str, float | None]
__all__ = ["ControlStatus", "EntropyBand", "EntropyStatus", "EntropyTarget", "JobSamples", "JobWarning"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------------------------- identity


class TenantObject(BaseModel):
    id: str
    object: Literal["tenant"] = "tenant"
    name: str
    created_at: datetime


class ApiKeyObject(BaseModel):
    id: str
    object: Literal["api_key"] = "api_key"
    name: str
    prefix: str = Field(description="The key's first characters, for recognising it; not a secret.")
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class ApiKeyCreated(ApiKeyObject):
    key: str = Field(description="The secret key. Shown only in this response; store it now.")


class ApiKeyCreate(_Request):
    name: Annotated[str, StringConstraints(min_length=1, max_length=200)] = "default"


class ApiKeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ApiKeyObject]


class Limits(BaseModel):
    max_active_jobs: int | None = Field(
        description="Jobs not yet finished that the tenant may have; null: none."
    )
    max_upload_bytes: int
    rate_limit_per_second: float | None = Field(
        description="Sustained requests per second per key; null: off."
    )
    rate_limit_burst: int
    tenant_rate_limit_per_second: float | None = Field(
        description="Sustained requests per second of the tenant, all its keys together; null: off."
    )
    tenant_rate_limit_burst: int
    max_active_api_keys: int | None = Field(description="Active (not revoked) API keys a tenant may have.")


class Usage(BaseModel):
    active_jobs: int
    jobs: int
    files: int
    file_bytes: int


class Me(BaseModel):
    object: Literal["identity"] = "identity"
    tenant: TenantObject
    api_key: ApiKeyObject
    limits: Limits
    usage: Usage


# ------------------------------------------------------------------------------------------------- files


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    filename: str
    purpose: FilePurpose
    bytes: int
    sha256: str
    records: int = Field(description="Non-blank lines (training examples) in the file.")
    status: Literal["valid"] = Field(
        default="valid", description="Files are checked on upload; invalid ones are refused."
    )
    created_at: datetime


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    has_more: bool
    first_id: str | None
    last_id: str | None


class Deleted(BaseModel):
    id: str
    object: str
    deleted: Literal[True] = True


# --------------------------------------------------------------------------------------------- catalogue


class ModelObject(BaseModel):
    id: str = Field(description="The name to put in spec.model.name.")
    object: Literal["model"] = "model"
    description: str
    builtin: bool = Field(
        description="Shipped with the trainer (true) or configured by the operator (false)."
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


class VerifierParam(BaseModel):
    type: Literal["bool", "float", "int", "str"]
    default: Any
    description: str
    choices: list[str] | None = None
    minimum: float | None = None


class VerifierObject(BaseModel):
    object: Literal["verifier"] = "verifier"
    name: str
    description: str
    params: dict[str, VerifierParam]


class VerifierList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VerifierObject]


class VerifierRef(_Request):
    name: Annotated[str, StringConstraints(min_length=1, max_length=100)]
    params: dict[str, Any] = Field(default_factory=dict)


class ExampleIn(_Request):
    prompt: Annotated[str, StringConstraints(max_length=100_000)] = ""
    answer: Annotated[str, StringConstraints(max_length=100_000)]
    meta: dict[str, Any] = Field(
        default_factory=dict,
        description='What the verifier needs beyond the answer. reasoning_gym: {"reasoning_gym": {task, '
        "config, seed, size, index}} (the entry is rebuilt by the server; an `entry` is refused).",
    )


class VerifierTest(_Request):
    verifier: VerifierRef
    completion: Annotated[str, StringConstraints(max_length=100_000)] = Field(
        description="A model output to score."
    )
    example: ExampleIn
    reward_style: Literal["binary", "pm1"] = "binary"


class VerifierTestError(BaseModel):
    code: str
    message: str


class VerifierTestResult(BaseModel):
    object: Literal["verifier.test_result"] = "verifier.test_result"
    verifier: str
    params: dict[str, Any] = Field(description="The verifier's params with defaults filled in.")
    score: float | None = Field(description="In [0, 1]; null when the example cannot be scored (see error).")
    reward: float | None = Field(description="The score shaped by reward_style, as training would use it.")
    latency_ms: float
    error: VerifierTestError | None


# -------------------------------------------------------------------------------------------------- jobs


class JobCreate(_Request):
    """A job: the trainer's spec (TrainSpec; GET /docs shows every field and its default), the uploaded
    training file for a JSONL task, and free-form metadata."""

    spec: Annotated[
        dict[str, Any],
        # The trainer's TrainSpec, added to the OpenAPI components by service.app (validated in the route).
        WithJsonSchema({"allOf": [{"$ref": "#/components/schemas/TrainSpec"}]}),
    ] = Field(
        default_factory=dict,
        description="The job spec (TrainSpec). Unknown fields are refused; omitted fields take defaults.",
    )
    training_file: FileId | None = Field(
        default=None, description="Id of an uploaded rl_train file; sets task.source 'jsonl' and task.path."
    )
    metadata: (
        Annotated[
            dict[
                Annotated[str, StringConstraints(min_length=1, max_length=64)],
                Annotated[str, StringConstraints(max_length=512)],
            ],
            Field(max_length=16),
        ]
        | None
    ) = Field(default=None, description="Up to 16 string pairs (keys ≤ 64 chars, values ≤ 512 chars).")


class EstimateObject(JobEstimate):
    """The job's cost (contract.estimate.JobEstimate, its fields written there once), its resolved spec,
    and where it would stand: its queue and the tenant's active-job limit."""

    object: Literal["job.estimate"] = "job.estimate"
    valid: Literal[True] = True
    resolved_spec: dict[str, Any] = Field(description="The spec with every default filled in.")
    queue: str = Field(description="The queue of the worker class the job is routed to.")
    worker_class: str = Field(description="That class: a declared class or a live worker, by name.")
    jobs_ahead: int = Field(description="Jobs queued on the same queue now.")
    allowed_to_proceed: bool = Field(description="False when the tenant is at its active-job limit.")
    active_jobs: int
    max_active_jobs: int | None
    warnings: list[JobWarning] = Field(
        default_factory=list, description="What will likely make the job learn nothing, and what to change."
    )


class Progress(BaseModel):
    step: int
    total_steps: int
    fraction: float
    step_seconds: float | None = Field(description="Smoothed seconds per step (exponential moving average).")
    eta_seconds: float | None
    estimated_finish: datetime | None


class LatestMetrics(BaseModel):
    step: int
    at: datetime | None
    values: MetricValues


class JobError(BaseModel):
    code: str
    message: str
    param: str | None
    category: Literal["user", "system"] | None = Field(
        description="user: fix the spec or data (never retried); system: the service's fault (retried, "
        "except storage_full / storage_read_only / storage_io_error: the storage must be fixed first)."
    )


class JobWaiting(BaseModel):
    """Why a queued (or recovering) job is not running: no live worker serves its queue, or (GET only) a
    job of its queue is cancelling (its worker is free once that job's trainer has stopped)."""

    code: Literal["no_live_worker", "behind_cancelling"]
    queue: str
    message: str = Field(description="e.g. \"no live worker serves queue 'training'\"")


class GraderStatus(BaseModel):
    type: str
    name: str | None
    health: dict[str, float | None] = Field(
        description="The latest step's grader/* metrics: samples, errors, timeouts, non_finite, error rates, "
        "score mean and spread, the share of all-equal groups, seconds and share of the step."
    )
    warnings: list[dict[str, Any]] | None = Field(
        default=None, description="The loophole check's warnings at submission (GET /v1/jobs/{id} only)."
    )


class JobObject(BaseModel):
    id: str
    object: Literal["job"] = "job"
    name: str | None
    status: JobStatus
    model: str
    algorithm: str
    queue: str
    training_file: str | None
    metadata: dict[str, str]
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempt: int = Field(
        description="Runs started so far (a resume after a pause or a lost worker adds one)."
    )
    max_attempts: int = Field(
        description="The crash budget: the job fails when `failures` reaches it (and at once, code "
        "crash_loop, when a run fails without completing a step right after another failure)."
    )
    failures: int = Field(description="Runs that ended in a trainer crash so far.")
    lost_workers: int = Field(
        description="Runs lost to the infrastructure so far: a worker that stopped heartbeating, or a trainer "
        "killed (SIGKILL) by something other than the service. They do not spend the crash budget."
    )
    max_lost_workers: int = Field(description="The job fails (worker_lost) when `lost_workers` reaches it.")
    progress: Progress
    entropy: EntropyStatus
    control: ControlStatus | None = Field(
        default=None,
        description="The PI entropy law's state from the latest step's metrics; null for a job without one.",
    )
    latest_metrics: LatestMetrics | None
    error: JobError | None
    waiting: JobWaiting | None = Field(
        default=None,
        description="For a queued or recovering job that no live worker can take (no worker of its queue "
        "has beaten within the registry's stale time): why it waits. Null otherwise; it goes once a worker "
        "of the queue starts.",
    )
    spec: dict[str, Any] = Field(description="The resolved spec the trainer runs.")
    disk_bytes: int | None = Field(
        default=None, description="Bytes of the job's files on the server (GET only)."
    )
    grader: GraderStatus | None = Field(
        default=None,
        description="A job with a grader (docs/GRADERS.md): its type and name, its health from the latest "
        "step's grader/* metrics, and (GET /v1/jobs/{id}) the loophole check's warnings at submission.",
    )
    warnings: list[JobWarning] = Field(
        default_factory=list,
        description="POST /v1/jobs and GET /v1/jobs/{id} only (empty in lists): what will likely make the job "
        "learn nothing and what to change, known at submission, then the trainer's latest of each kind.",
    )
    samples: JobSamples | None = Field(
        default=None, description="GET /v1/jobs/{id}: the latest samples of the evaluation and of training."
    )


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[JobObject]
    has_more: bool
    first_id: str | None
    last_id: str | None


class EventObject(BaseModel):
    id: int = Field(description="Sequence number within the job (1, 2, ...); the SSE id and the cursor.")
    object: Literal["job.event"] = "job.event"
    job_id: str
    type: str
    level: Literal["info", "warn", "error"]
    message: str
    step: int | None
    data: dict[str, Any] | None
    created_at: datetime


class EventList(BaseModel):
    object: Literal["list"] = "list"
    data: list[EventObject]
    has_more: bool
    last_id: int | None


class MetricPoint(BaseModel):
    step: int
    values: MetricValues


class MetricsHistory(BaseModel):
    object: Literal["job.metrics"] = "job.metrics"
    job_id: str
    names: list[str] = Field(description="Every metric name present in `data`, sorted.")
    data: list[MetricPoint]
    has_more: bool


# ---------------------------------------------------------------------------------------------- health


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["ready"] = "ready"
    checks: dict[str, str]


# ------------------------------------------------------------------------------- documented error codes

_ERROR_DESCRIPTIONS = {
    400: "Malformed request (a body that cannot be parsed, a broken multipart form).",
    401: "Missing, invalid or revoked API key (or job page session).",
    403: "A job page session's write without its X-CSRF-Token header (never for a Bearer key).",
    404: "No such object for this tenant (another tenant's objects are indistinguishable from missing ones).",
    409: "The object's state does not allow this (e.g. deleting a running job).",
    413: "The body or file is over the size limit.",
    415: "Wrong Content-Type.",
    422: "A field is invalid; `param` names it (dotted path).",
    429: "Rate limit or active-job limit reached; see Retry-After.",
    503: "The database, broker or artifact storage is unavailable; see Retry-After.",
    507: "The artifact storage is full; nothing was stored. See Retry-After.",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for the given error statuses, all in the one error shape."""
    return {code: {"model": ErrorResponse, "description": _ERROR_DESCRIPTIONS[code]} for code in codes}


AUTHENTICATED_ERRORS = errors(400, 401, 403, 413, 422, 429, 503)
