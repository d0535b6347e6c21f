"""Typed objects of the API's responses, mirroring service/schemas.py field for field.

They are the client's own copy (the client imports nothing of the server): tests/client/test_drift.py
compares each one with the API's OpenAPI schema (field names and which are required), so a field added to,
renamed in or dropped from the server fails the tests until the client follows. Unknown fields are kept
(`extra="allow"`), so an older client still reads a newer server's answers.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

JobStatus = Literal[
    "validating",
    "queued",
    "running",
    "pausing",
    "paused",
    "recovering",
    "cancelling",
    "cancelled",
    "succeeded",
    "failed",
]
MetricValues = dict[str, float | None]


class APIObject(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


# ---------------------------------------------------------------------------------------------- identity


class Tenant(APIObject):
    id: str
    object: Literal["tenant"] = "tenant"
    name: str
    created_at: datetime


class ApiKey(APIObject):
    id: str
    object: Literal["api_key"] = "api_key"
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class ApiKeyCreated(ApiKey):
    key: str = Field(description="The secret; shown only once.")


class ApiKeyList(APIObject):
    object: Literal["list"] = "list"
    data: list[ApiKey]


class Limits(APIObject):
    max_active_jobs: int | None
    max_upload_bytes: int
    rate_limit_per_second: float | None
    rate_limit_burst: int
    tenant_rate_limit_per_second: float | None
    tenant_rate_limit_burst: int
    max_active_api_keys: int | None


class Usage(APIObject):
    active_jobs: int
    jobs: int
    files: int
    file_bytes: int


class Me(APIObject):
    object: Literal["identity"] = "identity"
    tenant: Tenant
    api_key: ApiKey
    limits: Limits
    usage: Usage


# ------------------------------------------------------------------------------------------------- files


class File(APIObject):
    id: str
    object: Literal["file"] = "file"
    filename: str
    purpose: Literal["rl_train", "rl_eval"]
    bytes: int
    sha256: str
    records: int
    status: Literal["valid"] = "valid"
    created_at: datetime


class FileList(APIObject):
    object: Literal["list"] = "list"
    data: list[File]
    has_more: bool
    first_id: str | None
    last_id: str | None


class Deleted(APIObject):
    id: str
    object: str
    deleted: Literal[True] = True


class Model(APIObject):
    id: str
    object: Literal["model"] = "model"
    description: str
    builtin: bool


class ModelList(APIObject):
    object: Literal["list"] = "list"
    data: list[Model]


# -------------------------------------------------------------------------------------------------- jobs


class MemoryPerDevice(APIObject):
    strategy: str
    processes: int
    prompt_tokens: int
    micro_batch_tokens: int
    parameters_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    gathered_bytes: int
    activations_bytes: int
    not_coexisting_bytes: int
    rollout_gathered_bytes: int = 0
    total_bytes: int


class Estimate(APIObject):
    object: Literal["job.estimate"] = "job.estimate"
    valid: Literal[True] = True
    resolved_spec: dict[str, Any]
    total_steps: int
    responses_per_step: int
    total_responses: int
    max_completion_tokens: int
    forward_backward_passes: int
    sft_steps: int
    sft_examples: int
    evaluations: int
    eval_completions: int
    checkpoints: int
    num_processes: int
    memory_per_device: MemoryPerDevice | None
    queue: str
    worker_class: str
    jobs_ahead: int
    allowed_to_proceed: bool
    active_jobs: int
    max_active_jobs: int | None
    warnings: list[JobWarning] = []  # what will likely make the job learn nothing, and what to change


class JobWarning(APIObject):
    """What will likely make a job learn nothing, and what to change (the service's contract/warnings.py):
    unknown_characters, no_chat_template (at submission), truncated_responses, constant_reward,
    entropy_far_from_band (during training: the latest of each kind)."""

    kind: str
    message: str
    step: int | None = None
    count: int = 1  # steps it held so far (unknown_characters: the characters counted)
    first_step: int | None = None


class Sample(APIObject):
    prompt: str
    completion: str
    reference: str | None
    reward: float
    truncated: bool  # cut at sampling.max_new_tokens


class SampleSet(APIObject):
    step: int
    samples: list[Sample]


class JobSamples(APIObject):
    """The latest evaluation's first held-out examples and a recent training step's responses."""

    eval: SampleSet | None = None
    train: SampleSet | None = None


class Progress(APIObject):
    step: int
    total_steps: int
    fraction: float
    step_seconds: float | None
    eta_seconds: float | None
    estimated_finish: datetime | None


class EntropyBand(APIObject):
    low: float | None
    high: float | None


class EntropyTarget(APIObject):
    value: float  # the resolved target (nats); a relative target is r × H0, H0 measured as RL starts
    state: Literal["below", "at_or_above"] | None


class EntropyStatus(APIObject):
    value: float | None
    band: EntropyBand
    state: Literal["in_band", "below", "above"] | None
    steps_out_of_band: int | None
    target: EntropyTarget | None = None
    # Time to collapse and holding of the target (the service's contract/stability.py); null until known.
    collapse_step: int | None = None
    target_hold_fraction: float | None = None
    post_gate_steps: int | None = None


class ControlStatus(APIObject):
    """The PI entropy law at the latest step (null values before its first step)."""

    law: str
    target: float | None
    output: float | None
    error: float | None
    integral: float | None
    actuator: float | None
    at_clip: bool | None
    saturated_steps: int | None
    saturated: bool  # at the clip 20+ steps (raising) or 50+ (lowering): ControllerSaturated's condition


class LatestMetrics(APIObject):
    step: int
    at: datetime | None
    values: MetricValues


class JobError(APIObject):
    code: str
    message: str
    param: str | None
    category: Literal["user", "system"] | None


class JobWaiting(APIObject):
    """Why a queued (or recovering) job is not running: no live worker consumes its queue, or (GET of one
    job) a job of its queue is cancelling."""

    code: Literal["no_live_worker", "behind_cancelling"]
    queue: str
    message: str  # "no live worker serves queue 'training'"


class GraderStatus(APIObject):
    """A job's grader (docs/GRADERS.md): its type and name, the latest step's grader/* metrics and the
    loophole warnings of its submission (GET of one job only)."""

    type: str
    name: str | None
    health: dict[str, float | None]
    warnings: list[dict[str, Any]] | None = None


class Job(APIObject):
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
    attempt: int
    max_attempts: int
    failures: int
    lost_workers: int
    max_lost_workers: int
    progress: Progress
    entropy: EntropyStatus
    control: ControlStatus | None = None
    latest_metrics: LatestMetrics | None
    error: JobError | None
    waiting: JobWaiting | None = None  # set while no live worker serves the job's queue
    spec: dict[str, Any]
    grader: GraderStatus | None = None
    warnings: list[JobWarning] = []
    samples: JobSamples | None = None  # GET of one job only
    disk_bytes: int | None = None  # bytes of the job's files on the server (GET of one job only)

    @property
    def is_terminal(self) -> bool:
        """succeeded, failed or cancelled: the job will not change any more."""
        from stare_client.states import is_terminal

        return is_terminal(self.status)


class JobList(APIObject):
    object: Literal["list"] = "list"
    data: list[Job]
    has_more: bool
    first_id: str | None
    last_id: str | None


class Event(APIObject):
    id: int = Field(description="Sequence number within the job (1, 2, ...).")
    object: Literal["job.event"] = "job.event"
    job_id: str
    type: str
    level: Literal["info", "warn", "error"]
    message: str
    step: int | None
    data: dict[str, Any] | None
    created_at: datetime


class EventList(APIObject):
    object: Literal["list"] = "list"
    data: list[Event]
    has_more: bool
    last_id: int | None


class MetricPoint(APIObject):
    step: int
    values: MetricValues


class MetricsHistory(APIObject):
    object: Literal["job.metrics"] = "job.metrics"
    job_id: str
    names: list[str]
    data: list[MetricPoint]
    has_more: bool


class Checkpoint(APIObject):
    id: str
    object: Literal["job.checkpoint"] = "job.checkpoint"
    job_id: str
    step: int
    created_at: datetime
    bytes: int | None
    sha256: str | None
    metrics: MetricValues | None
    download_url: str


class CheckpointList(APIObject):
    object: Literal["list"] = "list"
    data: list[Checkpoint]


# ------------------------------------------------------------------------------------------------ report
# The report (trainer/report/summary.py, REPORT_VERSION 1) is not in the OpenAPI schema (the route returns
# a free-form object); these name the parts scripts read and keep the rest as extra fields.


class EvalRow(APIObject):
    step: int
    avg_at_k: float | None = None
    pass_at_k: float | None = None
    k: int | None = None
    response_length: float | None = None
    num_prompts: int | None = None


class Evaluation(APIObject):
    k: int | None = None
    before: EvalRow | None = None
    after: EvalRow | None = None
    delta: dict[str, float | None] = Field(default_factory=dict)
    history: list[EvalRow] = Field(default_factory=list)


class ReportJob(APIObject):
    id: str | None = None
    name: str | None = None
    algorithm: str | None = None
    model: str | None = None
    status: str | None = None
    steps_done: int | None = None
    total_steps: int | None = None
    duration_s: float | None = None


class Report(APIObject):
    report_version: int
    job: ReportJob
    evaluation: Evaluation
    entropy: dict[str, Any] = Field(default_factory=dict)
    gate: dict[str, Any] = Field(default_factory=dict)
    reward: dict[str, Any] = Field(default_factory=dict)
    response_length: dict[str, Any] = Field(default_factory=dict)
    quadrants: dict[str, Any] = Field(default_factory=dict)
    perf: dict[str, Any] = Field(default_factory=dict)
    series: dict[str, list[list[float]]] = Field(default_factory=dict)
    # eval_first, eval_last, train_last: the first and last evaluation's and the latest training samples
    samples: dict[str, SampleSet | None] = Field(default_factory=dict)
    warnings: list[JobWarning] = Field(default_factory=list)  # the latest of each kind
