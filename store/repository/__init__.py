"""All SQL of the service and of the worker. Functions take a Session, or (the API's reads of one row or one
count, and creating a job) the database's event-loop pool, `Database.async_pool`; one function per operation.
Session functions never commit; a pool function's statement is its own transaction.

Modules, one per seam; this package re-exports them, so callers write `repository.create_job(...)`:

- tenants: tenants and API keys
- files: uploaded datasets
- jobs: create (Idempotency-Key), read, list, cancel/pause/resume/delete
- events: the per-job event log
- metrics: step metrics, evals, the report's history
- checkpoints: checkpoint rows
- leases: the worker side (claim, heartbeat, fenced writes, finish/retry) and the sweeper's repairs
- workers: the worker registry (what each live worker can run, its heartbeat)

API side: every read and write of a tenant's object takes the tenant id (files, jobs, keys) or a job that
was already loaded with it (events, metrics, checkpoints), so scoping happens here and only here.

Worker side (issue 5): claim_job, heartbeat, record_step_metrics, record_eval, append_event, add_checkpoint,
finish_job, retry_job take the job's lease token and fence on it. The fence is the first statement of the
write: an UPDATE of the job row `WHERE id = :job AND lease_token = :token AND status IN (leased states)`.
When it matches no row the lease is gone (the sweeper recovered the job, or another worker claimed it), the
function writes nothing else and returns False/None, and the worker must stop. The caller commits:

    with db.transaction() as session:          # commits on success
        if not repository.record_step_metrics(session, job_id, token, step, metrics):
            raise LeaseLost(job_id)

Idempotency: metric and eval rows are unique per (job, step) and a repeated write overwrites the row (a
step redone after a resume keeps its last values); checkpoints are unique per (job, step); an event with a
dedupe_key is written once. Non-finite floats in metrics are stored as null (PostgreSQL JSON has no NaN).

Errors: store.errors (Conflict, Invalid), without HTTP statuses; the API maps them (service.errors).
"""

from __future__ import annotations

from store.models import utcnow  # the clock every write uses (tests pass `now` from it)
from store.repository._common import db_now
from store.repository.checkpoints import (
    checkpoints_trimmed,
    get_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    set_checkpoint_archive,
)
from store.repository.events import append_event, grader_warnings, list_events
from store.repository.files import create_file, delete_file, get_file, list_files
from store.repository.jobs import (
    NewJob,
    cancelling_in_queue,
    count_active_jobs,
    count_queued,
    count_waiting,
    create_job,
    delete_job,
    find_job_by_idempotency_key,
    get_job,
    job_status_counts,
    list_jobs,
    mark_enqueued,
    read_job,
    request_cancel,
    request_pause,
    resume_job,
)
from store.repository.leases import (
    FINISH_STATUSES,
    STEP_SECONDS_EMA_WEIGHT,
    STEP_SECONDS_METRIC,
    Claim,
    JobError,
    add_checkpoint,
    claim_job,
    crash_loop_message,
    crash_streak_after,
    finish_job,
    heartbeat,
    load_job,
    record_eval,
    record_step_metrics,
    recover_stale_jobs,
    remove_checkpoint,
    retry_job,
    unclaimed_jobs,
)
from store.repository.metrics import list_evals, list_metrics, metrics_at_steps, report_events
from store.repository.notes import JobNotes, job_notes, sample_events, warning_events
from store.repository.tenants import (
    KEY_TOUCH_INTERVAL,
    TenantUsage,
    create_api_key,
    create_tenant,
    find_api_key,
    get_api_key,
    get_tenant,
    get_tenant_by_name,
    list_api_keys,
    revoke_api_key,
    tenant_usage,
    touch_api_key,
)
from store.repository.workers import (
    forget_workers,
    jobs_without_worker,
    live_queues,
    live_workers,
    register_worker,
    remove_worker,
    worker_heartbeat,
)

__all__ = [
    "FINISH_STATUSES",
    "KEY_TOUCH_INTERVAL",
    "STEP_SECONDS_EMA_WEIGHT",
    "STEP_SECONDS_METRIC",
    "Claim",
    "JobError",
    "JobNotes",
    "NewJob",
    "TenantUsage",
    "add_checkpoint",
    "append_event",
    "cancelling_in_queue",
    "checkpoints_trimmed",
    "claim_job",
    "count_active_jobs",
    "count_queued",
    "count_waiting",
    "crash_loop_message",
    "crash_streak_after",
    "create_api_key",
    "create_file",
    "create_job",
    "create_tenant",
    "db_now",
    "delete_file",
    "delete_job",
    "find_api_key",
    "find_job_by_idempotency_key",
    "finish_job",
    "forget_workers",
    "get_api_key",
    "get_checkpoint",
    "get_file",
    "get_job",
    "get_tenant",
    "get_tenant_by_name",
    "grader_warnings",
    "heartbeat",
    "job_notes",
    "job_status_counts",
    "jobs_without_worker",
    "latest_checkpoint",
    "list_api_keys",
    "list_checkpoints",
    "list_evals",
    "list_events",
    "list_files",
    "list_jobs",
    "list_metrics",
    "live_queues",
    "live_workers",
    "load_job",
    "mark_enqueued",
    "metrics_at_steps",
    "read_job",
    "record_eval",
    "record_step_metrics",
    "recover_stale_jobs",
    "register_worker",
    "remove_checkpoint",
    "remove_worker",
    "report_events",
    "request_cancel",
    "request_pause",
    "resume_job",
    "retry_job",
    "revoke_api_key",
    "sample_events",
    "set_checkpoint_archive",
    "tenant_usage",
    "touch_api_key",
    "unclaimed_jobs",
    "utcnow",
    "warning_events",
    "worker_heartbeat",
]
