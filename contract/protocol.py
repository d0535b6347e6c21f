"""The trainer process's protocol with whoever runs it (the worker, the experiment runner, a person).

`python -m trainer run SPEC --out DIR [--events-stdout]`:
- exit code: `ExitCode`;
- events: one JSON object per line in DIR/events.jsonl and, with --events-stdout, on stdout as
  `@@event <json>` (EVENT_PREFIX); `EventType` names them and EVENT_FIELDS lists each one's fields;
- checkpoints: DIR/checkpoints/step-000050 (`checkpoint_name`, `checkpoint_step`), a folder that exists
  only once complete;
- under torchrun, which exits 1 whenever one of its processes fails, whatever that process's code: each
  failing process also writes an exit report (`exit_report`) to the file torchrun names in its
  TORCHELASTIC_ERROR_FILE (`ERROR_FILE_ENV`), in torch's error-file format. torchrun copies the first
  failure's report into its own error file, with that process's exit code as `errorCode`; the worker reads
  the code and the reason back there (`read_exit_report`).
Standard library only.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any

from contract import storage

EVENT_PREFIX = "@@event "
EVENTS_FILE = "events.jsonl"  # in the run folder
CHECKPOINTS_DIR = "checkpoints"  # in the run folder
CHECKPOINT_PREFIX = "step-"
CHECKPOINT_GLOB = CHECKPOINT_PREFIX + "*"
_STEP_DIGITS = 6


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # anything else: a crash (the traceback is on stderr)
    USER_ERROR = 2  # invalid spec or data
    NON_FINITE = 3  # non-finite loss or entropy; the `error` event names the step
    GRADER_FAILED = (
        4  # the job's grader failed past its error budget; the `error` event names the first failure
    )
    STORAGE = 74  # EX_IOERR: a write to the run folder failed; the `error` event has code, errno and path
    INTERRUPTED = 75  # stopped by SIGTERM/SIGINT after writing a checkpoint (resume with --resume)
    # The Ray driver (`python -m trainer.launch.ray_driver`, docs/DISTRIBUTED.md) only:
    # EX_UNAVAILABLE: the Ray cluster could not be reached, had no room, or went away
    CLUSTER_UNAVAILABLE = 69
    WORKER_LOST = 76  # a training process or its Ray node died: the attempt is lost, the job resumes


class EventType(StrEnum):
    STARTED = "started"
    RESUMED = "resumed"
    SFT = "sft"
    STEP = "step"
    EVAL = "eval"
    CHECKPOINT = "checkpoint"
    CHECKPOINT_DELETED = "checkpoint_deleted"
    INTERRUPTED = "interrupted"
    FINISHED = "finished"
    ERROR = "error"
    # A controller's relative target resolved on the first RL step (target, H₀, the band around it).
    TARGETS_RESOLVED = "targets_resolved"
    # A few prompts with their completions, references and rewards (contract.samples).
    SAMPLES = "samples"
    # Something that will likely make the run learn nothing, and what to change (contract.warnings).
    WARNING = "warning"


class ErrorCode(StrEnum):
    """The `code` of an `error` event: non_finite, grader_failed, or one of contract.storage.STORAGE_CODES."""

    NON_FINITE = "non_finite"
    GRADER_FAILED = "grader_failed"  # a user error: the tenant's grader (docs/GRADERS.md)
    STORAGE_FULL = storage.STORAGE_FULL
    STORAGE_READ_ONLY = storage.STORAGE_READ_ONLY
    STORAGE_IO_ERROR = storage.STORAGE_IO_ERROR


class FailureCode(StrEnum):
    """The codes a failed job's error carries that the worker and the store set (beside the trainer's
    ErrorCode, which a failed job carries as it came)."""

    INVALID_JOB = "invalid_job"  # the trainer refused the spec or its data (exit 2): a user error
    TRAINER_CRASHED = "trainer_crashed"  # the trainer could not start, or exited with another code
    TRAINER_KILLED = "trainer_killed"  # the trainer was SIGKILLed (out of memory, an operator)
    CRASH_LOOP = "crash_loop"  # attempts in a row failed at the same step
    WORKER_LOST = "worker_lost"  # the lost-worker budget ran out
    RAY_UNAVAILABLE = "ray_unavailable"  # the job's Ray cluster is unreachable, too small, or went away
    RAY_WORKER_LOST = "ray_worker_lost"  # a Ray node or training process died (retried, lost-worker budget)


# Every code a failed job can carry: what the exporter publishes (stare_failed_jobs) and alerts read.
JOB_FAILURE_CODES: tuple[str, ...] = tuple(sorted({code.value for code in (*FailureCode, *ErrorCode)}))


@dataclass(frozen=True)
class EventFields:
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    doc: str = ""


# Every event also has "type" and "time" (ISO 8601, UTC; added when it is emitted).
COMMON_FIELDS = ("type", "time")
EVENT_FIELDS: dict[EventType, EventFields] = {
    EventType.STARTED: EventFields(
        ("spec", "total_steps"), doc="A fresh run: the spec with every default resolved, the steps it runs."
    ),
    EventType.RESUMED: EventFields(
        ("step", "checkpoint"), doc="Continued from the checkpoint folder `checkpoint` at `step`."
    ),
    EventType.SFT: EventFields(
        ("step", "total", "loss"), doc="SFT warm-start progress: every 100 steps and at the last."
    ),
    EventType.STEP: EventFields(
        ("step", "metrics"), doc="One optimiser step: every metric of contract.metrics that applies."
    ),
    EventType.EVAL: EventFields(("step", "metrics"), doc="An evaluation: the eval/* metrics."),
    EventType.CHECKPOINT: EventFields(
        ("step", "path"), doc="A complete checkpoint folder (absolute path) at `step`."
    ),
    EventType.CHECKPOINT_DELETED: EventFields(("step",), doc="The checkpoint at `step` was pruned."),
    EventType.INTERRUPTED: EventFields(
        ("step", "signal"), doc="Stopped by a signal after a checkpoint at `step`; exit 75 follows."
    ),
    EventType.FINISHED: EventFields(
        ("step", "status", "final_eval"), doc="The run is done; `final_eval` holds the last eval metrics."
    ),
    EventType.TARGETS_RESOLVED: EventFields(
        ("step", "target_entropy", "initial_entropy", "relative", "band_low", "band_high"),
        doc="A relative target entropy resolved on the first RL step: `relative` × H₀ (`initial_entropy`, "
        "nats) = `target_entropy`, and the entropy band in use from then on.",
    ),
    EventType.SAMPLES: EventFields(
        ("step", "phase", "samples"),
        doc="`phase` eval: the first held-out examples of the evaluation at `step`, one completion each; "
        "train: a few responses of training step `step`. Each sample: prompt, completion, reference, reward, "
        "truncated (contract.samples bounds them).",
    ),
    EventType.WARNING: EventFields(
        ("step", "kind", "message", "count", "first_step"),
        doc="A contract.warnings kind held at `step` (`count` steps so far, since `first_step`); `message` "
        "says what to change. Repeated at most every 10 steps while it holds, and on the last step.",
    ),
    EventType.ERROR: EventFields(
        ("step", "code", "message"),
        ("errno", "path"),
        doc="Why the run stops: `code` is an ErrorCode; storage faults add the errno name and the path.",
    ),
}


def event_type(value: object) -> EventType:
    """The EventType named `value`; ValueError listing the known ones otherwise."""
    try:
        return EventType(str(value))
    except ValueError:
        valid = ", ".join(t.value for t in EventType)
        raise ValueError(f"unknown event type {value!r}; valid: {valid}") from None


def check_event(event: dict[str, Any]) -> dict[str, Any]:
    """The event, or ValueError when its type is unknown, a required field is missing or a field is not
    one of its own."""
    kind = event_type(event.get("type"))
    fields = EVENT_FIELDS[kind]
    missing = [name for name in fields.required if name not in event]
    if missing:
        raise ValueError(f"{kind.value} event without {', '.join(missing)}")
    known = {*COMMON_FIELDS, *fields.required, *fields.optional}
    extra = sorted(set(event) - known)
    if extra:
        raise ValueError(f"{kind.value} event with unknown field(s) {', '.join(extra)}")
    return event


def format_event_line(event: dict[str, Any]) -> str:
    """The stdout line of an event (without the newline)."""
    return EVENT_PREFIX + json.dumps(check_event(event), sort_keys=True)


def parse_event_line(line: str) -> dict[str, Any] | None:
    """The event on a stdout line, or None when the line is not one (no prefix, not a JSON object)."""
    if not line.startswith(EVENT_PREFIX):
        return None
    try:
        event = json.loads(line[len(EVENT_PREFIX) :])
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


def checkpoint_name(step: int) -> str:
    """step-000050 for step 50."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"a checkpoint step must be a non-negative integer, got {step!r}")
    return f"{CHECKPOINT_PREFIX}{step:0{_STEP_DIGITS}d}"


def checkpoint_step(name: str) -> int | None:
    """50 for step-000050; None for a name that is not a checkpoint folder's."""
    if not name.startswith(CHECKPOINT_PREFIX):
        return None
    digits = name[len(CHECKPOINT_PREFIX) :]
    if not digits.isascii() or not digits.isdigit():
        return None
    return int(digits)


# --- exit reports under torchrun ---------------------------------------------------------------------------

# torch.distributed.elastic's error file: torchrun sets it per process (where that process reports a failure)
# and reads it for itself (where it copies the first failure's report, with its exit code, when it ends).
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


@dataclass(frozen=True)
class ExitReport:
    """What a failed process of a torchrun launch reported: its exit code, why, and (a crash) its traceback."""

    code: int
    message: str
    callstack: str = ""

    @property
    def text(self) -> str:
        """The reason as a stderr tail reads: the message, or the traceback it ends."""
        return self.callstack.rstrip() or self.message


def exit_report(message: str, callstack: str = "") -> str:
    """A process's report (JSON) in the format of torch's ErrorHandler.record_exception, which torchrun's
    agent parses (the timestamp picks the first failure) and copies, adding the process's exit code.
    Without a traceback the message stands in its place: torchrun's failure summary on stderr shows it."""
    info = {"py_callstack": callstack or message, "timestamp": str(int(time.time()))}
    return json.dumps({"message": {"message": message, "extraInfo": info}})


def read_exit_report(text: str) -> ExitReport | None:
    """The report in torchrun's own error file, or None when it holds none with an exit code (torchrun
    recorded its own failure, e.g. the SIGTERM of a cooperative stop, or the text is not a report)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    body = data.get("message") if isinstance(data, dict) else None
    if not isinstance(body, dict):
        return None
    code, message = body.get("errorCode"), body.get("message")
    if isinstance(code, bool) or not isinstance(code, int) or not isinstance(message, str):
        return None
    extra = body.get("extraInfo")
    callstack = extra.get("py_callstack") if isinstance(extra, dict) else None
    return ExitReport(code, message, callstack if isinstance(callstack, str) else "")
