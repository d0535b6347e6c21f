"""One training job on this worker: claim → run the trainer as a child → record → finish.

Every database write goes through `Recorder`, which retries with exponential backoff while the database is
unreachable (events wait in memory meanwhile, in order) and stops the run the moment the lease is lost
(another worker owns the job: write nothing more). Writes are idempotent (metrics per (job, step),
checkpoints per (job, step)), so a resumed attempt that redoes steps after its checkpoint leaves no
duplicates and no gaps.

How the run ends, by the trainer's exit code (contract.protocol.ExitCode):
  0 → succeeded; 2 → failed (user: bad spec or data, never retried); 3 → failed (user: non-finite loss or
  entropy at step k; the last checkpoint stays downloadable); 74 → failed (system; storage_full,
  storage_read_only or storage_io_error, from the trainer's `error` event, with the errno name and path: a
  write to the run folder failed. Never retried: the next attempt would meet the same disk. The checkpoints
  recorded before stay, a half-written one never gets a row); 75 after our cancel/pause → cancelled/paused;
  killed by a SIGKILL we did not send (the OOM killer, an operator, the container runtime) → an
  infrastructure failure, `trainer_killed`, on the job's lost-worker budget like a worker that stopped
  heartbeating (lost_workers / max_lost_workers); anything else (a crash, 75 from a shutdown we did not ask
  for) → `trainer_crashed`, on the job's crash budget (failures / max_attempts). Either way the job is
  recovering and re-sent, resuming from its latest checkpoint, until its budget is spent, or until it failed
  twice in a row, the second time without completing a step (`crash_loop`): then failed (system). The
  budget arithmetic is repository.retry_job's. A crash message quotes the trainer's last stderr lines (kept
  in memory by the supervisor), never an empty string.
Under torchrun (a one-node job over several processes) these are the trainer's codes too: torchrun's own
exit 1 is mapped back to its first failed process's code (worker/supervisor.py).
The Ray driver of a multi-node job (docs/DISTRIBUTED.md) adds two: 69 → failed (system, `ray_unavailable`:
the cluster did not answer, had no room, or went away; not retried, the next attempt would meet the same
cluster); 76 → `ray_worker_lost` (a training process or its Ray node died), on the lost-worker budget like
`trainer_killed`, resumed from the latest checkpoint.

The worker's own writes after the claim (the spec file, the trainer log) fail the job the same way as the
trainer's exit 74, instead of raising out of the task and leaving the job to the sweeper (which would count
each attempt as a lost worker).

Artifacts go through the artifact storage (store.artifacts): the run folder the trainer works in is the
storage's local path of the job's run key, and the trainer's outputs are recorded by key. What the tenant
sees (the job's error, its events) names paths relative to the tenant's folder; the server's absolute
paths stay in the worker's log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import queue
import re
import signal
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy.exc
from pydantic import ValidationError

from contract.protocol import (
    ErrorCode,
    EventType,
    ExitCode,
    FailureCode,
)
from contract.storage import STORAGE_CODES, STORAGE_IO_ERROR, StorageError, storage_code
from store import repository
from store.artifacts import ArtifactStorage, open_artifact_storage
from store.database import Database
from store.repository import Claim, JobError
from worker import records
from worker.launching import NoCluster, spec_refusal, start_trainer
from worker.retention import Retention
from worker.settings import WorkerSettings
from worker.supervisor import TrainerProcess, log_tail

logger = logging.getLogger(__name__)
T = TypeVar("T")

_ERRNO_NAME = re.compile(r"cannot write .*: (E[A-Z0-9]+) \(")  # contract.storage.StorageError's message
ERROR_LINES = 3  # a crash message quotes this many of the trainer's last stderr lines (a traceback's end)
FLUSH_S = 0.5  # metric rows reach the database within this long of the step
MAX_BATCH = 64
# A checkpoint is recorded the moment it arrives, not with the next batch: until its row exists, a worker
# lost now would discard the folder (discard_unrecorded_checkpoints) and the next attempt would redo its steps.
FLUSH_NOW = frozenset({EventType.CHECKPOINT})
TRANSIENT_DB_ERRORS = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)


class LeaseLost(Exception):
    pass


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def with_db_retry(db: Database, max_wait_s: float, fn: Callable[[Any], T], max_delay_s: float = 5.0) -> T:
    """Runs fn(session) in a transaction, retrying with exponential backoff (at most max_delay_s between
    tries) while the database is away."""
    delay, waited = min(0.2, max_delay_s), 0.0
    while True:
        try:
            with db.transaction() as session:
                return fn(session)
        except TRANSIENT_DB_ERRORS:
            if waited >= max_wait_s:
                raise
            logger.warning("database unavailable; retrying in %.1f s", delay)
            time.sleep(delay)
            waited += delay
            delay = min(delay * 2, max_delay_s)


class Recorder:
    """Fenced, retried writes for one claimed job."""

    def __init__(
        self, db: Database, claim: Claim, settings: WorkerSettings, storage: ArtifactStorage
    ) -> None:
        self.db, self.claim, self.settings, self.storage = db, claim, settings, storage
        self.last_error: str | None = None
        self.last_error_event: dict[str, Any] | None = None  # the trainer's last `error` event
        self.retention = Retention(claim, storage, self._retry)  # which checkpoints keep optimizer state

    def _retry(self, fn: Callable[[Any], T]) -> T:
        # Back off at most one heartbeat period: the heartbeat is renewed soon after the database returns.
        return with_db_retry(
            self.db, self.settings.db_retry_max_s, fn, max_delay_s=min(5.0, self.settings.heartbeat_s)
        )

    def _fenced(self, fn: Callable[[Any], Any]) -> Any:
        result = self._retry(fn)
        if result is None or result is False:
            raise LeaseLost(self.claim.job_id)
        return result

    def heartbeat(self) -> str:
        c = self.claim
        return str(
            self._fenced(
                lambda s: repository.heartbeat(s, c.job_id, c.lease_token, lease_s=self.settings.lease_s)
            )
        )

    def record(self, event: dict[str, Any]) -> None:
        self.record_batch([event])

    def record_batch(self, events: list[dict[str, Any]]) -> None:
        """Writes the events' rows in one transaction (one COMMIT for several steps: cheap streaming)."""
        ops = [op for event in events for op in self._operations(event)]
        if ops:
            # Every op is fenced; the first one's UPDATE locks the job row, so the rest see the same lease.
            self._fenced(lambda s: all(op(s) for op in ops))
            self.retention.recorded(events)

    def _operations(self, event: dict[str, Any]) -> list[Callable[[Any], Any]]:
        return records.operations(self, event)

    def _shown(self, error: JobError) -> JobError:
        """The error as the tenant reads it (paths relative to its folder)."""
        message = self.storage.shown_to_tenant(error.message, self.claim.tenant_id)
        return dataclasses.replace(error, message=message)

    def finish(self, status: str, error: JobError | None = None) -> None:
        c = self.claim
        error = self._shown(error) if error is not None else None
        self._fenced(lambda s: repository.finish_job(s, c.job_id, c.lease_token, status, error=error))
        self.retention.finished(status)

    def retry(self, error: JobError, *, infrastructure: bool = False) -> str:
        c = self.claim
        error = self._shown(error)
        return str(
            self._fenced(
                lambda s: repository.retry_job(
                    s, c.job_id, c.lease_token, error, infrastructure=infrastructure
                )
            )
        )


def run_claimed(
    db: Database, claim: Claim, settings: WorkerSettings, resend: Callable[[str, str], None]
) -> str:
    """Supervises the trainer for a claimed job; returns the job's final status for this attempt."""
    storage = open_artifact_storage(settings.artifact_root)
    recorder = Recorder(db, claim, settings, storage)
    try:
        child, log_path = start_trainer(claim, settings, storage)
    except StorageError as err:  # our own write failed: the trainer would meet the same disk
        logger.error("job %s: %s", claim.job_id, err)
        return _finish(recorder, "failed", JobError(err.code, str(err)[:1000], "system"))
    except NoCluster as err:
        logger.error("job %s: %s", claim.job_id, err)
        return _finish(recorder, "failed", JobError(FailureCode.RAY_UNAVAILABLE, str(err), "system"))
    except ValidationError as err:  # a stored spec the contract refuses (a bound added since): the job's
        message = spec_refusal(err)  # error, never a worker crash (that would look like a lost worker)
        logger.error("job %s: %s", claim.job_id, message)
        return _finish(recorder, "failed", JobError(FailureCode.INVALID_JOB, message, "user"))
    except OSError as err:  # the trainer could not be started (no such interpreter, no memory to fork)
        logger.error("job %s: cannot start the trainer: %s", claim.job_id, err)
        error = JobError(FailureCode.TRAINER_CRASHED, f"cannot start the trainer: {err}", "system")
        return _retry(recorder, claim, error, resend)
    try:
        code, stop_reason = _supervise(child, recorder, settings)
    except LeaseLost:
        logger.warning("lease lost for job %s; stopping its trainer", claim.job_id)
        child.kill()
        child.wait(timeout=60)
        return "lease_lost"
    except BaseException:
        child.kill()
        child.wait(timeout=60)
        raise
    # Under torchrun its stderr ends with its own failure summary: the failed process's report says why.
    report = child.exit_report
    tail = report.text if report is not None else child.stderr_tail.text() or log_tail(log_path)
    return _conclude(recorder, claim, code, stop_reason, tail, resend)


def _supervise(child: TrainerProcess, recorder: Recorder, settings: WorkerSettings) -> tuple[int, str | None]:
    """Records the trainer's events until its output ends, heartbeats the lease, passes a cancel or pause on
    (killing the trainer past the grace); returns (exit code, "cancelled" | "paused" | None)."""
    stop_reason: str | None = None
    stop_sent_at = 0.0
    last_beat = time.monotonic()
    finished_output = False
    while not finished_output:
        batch, finished_output = _next_events(child, wait_s=min(1.0, settings.heartbeat_s))
        if batch:
            recorder.record_batch(batch)
        if time.monotonic() - last_beat >= settings.heartbeat_s:
            status = recorder.heartbeat()
            last_beat = time.monotonic()
            if status in ("cancelling", "pausing") and stop_reason is None:
                stop_reason = "cancelled" if status == "cancelling" else "paused"
                stop_sent_at = time.monotonic()
        if stop_reason:  # until the trainer can take it (TrainerProcess.request_stop), then a no-op
            child.request_stop()
            if child.poll() is None and time.monotonic() - stop_sent_at > settings.cancel_grace_s:
                child.kill()
    return child.wait(timeout=60), stop_reason


def _next_events(child: TrainerProcess, wait_s: float) -> tuple[list[dict[str, Any]], bool]:
    """(events, the trainer's output ended): the next event within wait_s, then what else arrives within
    FLUSH_S (one transaction for several steps), up to MAX_BATCH or an event that must be flushed at once."""
    try:
        event = child.events.get(timeout=wait_s)
    except queue.Empty:
        return [], False
    if event is None:
        return [], True
    batch = [event]
    flush_at = time.monotonic() + FLUSH_S
    while len(batch) < MAX_BATCH and batch[-1].get("type") not in FLUSH_NOW:
        try:
            more = child.events.get(timeout=max(0.0, flush_at - time.monotonic()))
        except queue.Empty:
            break
        if more is None:
            return batch, True
        batch.append(more)
    return batch, False


def _finish(recorder: Recorder, status: str, error: JobError | None = None) -> str:
    try:
        recorder.finish(status, error)
    except LeaseLost:
        return "lease_lost"
    return status


def _retry(
    recorder: Recorder,
    claim: Claim,
    error: JobError,
    resend: Callable[[str, str], None],
    *,
    infrastructure: bool = False,
) -> str:
    try:
        status = recorder.retry(error, infrastructure=infrastructure)
    except LeaseLost:
        return "lease_lost"
    if status == "recovering":
        resend(claim.job_id, claim.queue)
    return status


def _conclude(
    recorder: Recorder,
    claim: Claim,
    code: int,
    stop_reason: str | None,
    tail: str,
    resend: Callable[[str, str], None],
) -> str:
    """The attempt's end from the trainer's exit code. `tail`: the end of its stderr (the in-memory copy,
    else the log file's)."""
    try:
        if code == ExitCode.OK:
            recorder.finish("succeeded")
            return "succeeded"
        if code == ExitCode.INTERRUPTED and stop_reason is not None:
            recorder.finish(stop_reason)
            return stop_reason
        if code == ExitCode.USER_ERROR:
            recorder.finish(
                "failed",
                JobError(FailureCode.INVALID_JOB, _last_line(tail) or "the trainer rejected the job", "user"),
            )
            return "failed"
        if code in (ExitCode.NON_FINITE, ExitCode.GRADER_FAILED):  # user errors its `error` event explains
            fallback = _non_finite_message(tail) if code == ExitCode.NON_FINITE else _last_line(tail)
            message = recorder.last_error or fallback or "the job's grader failed"
            recorder.finish("failed", JobError(ErrorCode[ExitCode(code).name], message, "user"))
            return "failed"
        if code == ExitCode.STORAGE or _is_storage_fault(recorder.last_error_event):
            # Also without exit 74: under torchrun a process that failed because another one's disk was full
            # (save_sharded raises on every process) can be the first to exit, with 1.
            recorder.finish("failed", _storage_error(recorder.last_error_event, tail))
            return "failed"
        if stop_reason is not None:  # we asked it to stop and it died instead: still honour the request
            recorder.finish(stop_reason)
            return stop_reason
    except LeaseLost:
        return "lease_lost"
    if code == ExitCode.CLUSTER_UNAVAILABLE:  # the Ray driver: no cluster, no room, or it went away
        message = _marked_line(tail, FailureCode.RAY_UNAVAILABLE) or "the Ray cluster is unavailable"
        return _finish(recorder, "failed", JobError(FailureCode.RAY_UNAVAILABLE, message, "system"))
    if code == ExitCode.WORKER_LOST:  # the Ray driver: a node or a training process died
        reason = _marked_line(tail, FailureCode.RAY_WORKER_LOST)
        message = reason or _crash_message("lost a Ray worker", tail)
        error = JobError(FailureCode.RAY_WORKER_LOST, message, "system")
        return _retry(recorder, claim, error, resend, infrastructure=True)
    if code == -signal.SIGKILL:  # not ours (we kill only on a lost lease or a stop request, handled above)
        error = JobError(FailureCode.TRAINER_KILLED, _crash_message("was killed by SIGKILL", tail), "system")
        return _retry(recorder, claim, error, resend, infrastructure=True)
    error = JobError(FailureCode.TRAINER_CRASHED, _crash_message(_exit(code), tail), "system")
    return _retry(recorder, claim, error, resend)


def _exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _crash_message(what: str, tail: str) -> str:
    """The crash's message: what happened and the trainer's last stderr lines; never an empty tail (a
    trainer that printed nothing says so)."""
    lines = _error_lines(tail)
    if not lines:
        return f"trainer {what} and printed no error"
    return f"trainer {what}: {lines}"[:1000]


def _is_storage_fault(event: dict[str, Any] | None) -> bool:
    return event is not None and event.get("code") in STORAGE_CODES


def _storage_error(event: dict[str, Any] | None, tail: str) -> JobError:
    """The job's error for the trainer's exit 74, from its `error` event (code, errno, path, message)."""
    code = str((event or {}).get("code") or "")
    message = str((event or {}).get("message") or "")
    # the event was lost: its stderr line says the same ("error: cannot write P: ENOSPC (...)")
    if not message:
        message = _last_line(tail) or "the trainer could not write to the run folder"
        named = _ERRNO_NAME.search(message)
        code = storage_code(getattr(errno, named.group(1), None)) if named else STORAGE_IO_ERROR
    if code not in STORAGE_CODES:
        code = STORAGE_IO_ERROR
    return JobError(code, message[:1000], "system")


def _error_lines(text: str, count: int = ERROR_LINES) -> str:
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return "\n".join(lines[-count:])[-800:]


def _marked_line(text: str, code: str) -> str:
    """The Ray driver's own reason ("error: CODE: ..."), the last such line: Ray's log lines may follow it."""
    marker = f"error: {code}: "
    for line in reversed(text.splitlines()):
        if line.startswith(marker):
            return line.removeprefix(marker)[:1000]
    return ""


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:500] if lines else ""


def _non_finite_message(tail: str) -> str:
    for line in reversed(tail.splitlines()):
        if "non-finite" in line:
            return line.strip()[:500]
    return "non-finite loss or entropy"


def run_job(job_id: str, settings: WorkerSettings, db: Database, resend: Callable[[str, str], None]) -> str:
    """The task body: claim (one conditional UPDATE) or drop the message, then supervise."""

    def claim_fn(session: Any) -> Claim | None:
        return repository.claim_job(session, job_id, owner=worker_name(), lease_s=settings.lease_s)

    claim = with_db_retry(db, settings.db_retry_max_s, claim_fn)
    if claim is None:
        logger.info("job %s not claimable (owned, finished, paused or cancelled); message dropped", job_id)
        return "not_claimed"
    logger.info("claimed job %s (attempt %d)", job_id, claim.attempt)
    return run_claimed(db, claim, settings, resend)
