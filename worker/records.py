"""What the worker writes for each trainer event (contract.protocol): the database operations of one event,
run by the Recorder (worker/training.py) fenced by the job's lease, in one transaction per batch.

- `step`: the metric row, and a `step.completed` event with the step's headline metrics (the job's event
  stream shows progress; every metric is in the metric rows);
- `eval`: the eval row, and an `eval.completed` event with the eval/* metrics;
- `samples`: a `samples.eval` or `samples.train` event with the bounded samples (contract.samples);
- `warning`: a `warning.<kind>` event (level warn) with its count and first step (contract.warnings);
- `checkpoint`, `checkpoint_deleted`, `sft`, `resumed`, `error` as before.
Every job event carries a dedupe key (attempt, type, step), so a retried write (a COMMIT whose reply was
lost) is a no-op.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from contract.numbers import finite
from contract.samples import PHASES, checked_samples
from contract.warnings import TRAINING_KINDS
from store import repository

if TYPE_CHECKING:
    from worker.training import Recorder

Operation = Callable[[Any], Any]
logger = logging.getLogger("worker.training")

# The step metrics a `step.completed` event carries (the headline of the job's progress).
STEP_HEADLINE = (
    "entropy/mean",
    "reward/mean",
    "reward/accuracy",
    "response/length_mean",
    "response/truncated_fraction",
    "perf/step_seconds",
)


def operations(rec: Recorder, event: dict[str, Any]) -> list[Operation]:
    """The database operations that record `event` (none for an event the store does not keep)."""
    c = rec.claim
    kind = event.get("type")
    if kind == "step":
        step, metrics = int(event["step"]), event["metrics"]
        headline = {k: finite(metrics.get(k)) for k in STEP_HEADLINE if k in metrics}
        return [
            lambda s: repository.record_step_metrics(s, c.job_id, c.lease_token, step, metrics),
            event_op(rec, "step.completed", f"Step {step}", {"step": step, "metrics": headline}),
        ]
    if kind == "eval":
        step, metrics = int(event["step"]), event["metrics"]
        shown = {k: finite(v) for k, v in metrics.items()}
        return [
            lambda s: repository.record_eval(s, c.job_id, c.lease_token, step, metrics),
            event_op(rec, "eval.completed", f"Evaluation at step {step}", {"step": step, "metrics": shown}),
        ]
    if kind == "samples" and event.get("phase") in PHASES:
        return [_samples_op(rec, event)]
    if kind == "warning" and event.get("kind") in TRAINING_KINDS:
        return [_warning_op(rec, event)]
    if kind == "checkpoint":
        step, key = int(event["step"]), rec.storage.key_of(event["path"])
        # A folder already pruned (keep_last) when its event is recorded late (after a database outage)
        # has no bytes left: its row is written, then removed by the checkpoint_deleted event that follows.
        size = rec.storage.size(key) if rec.storage.exists(key) else 0
        return [
            lambda s: repository.add_checkpoint(s, c.job_id, c.lease_token, step, key, size=size),
            event_op(rec, "checkpoint.created", f"Checkpoint at step {step}", {"step": step, "path": key}),
        ]
    if kind == "checkpoint_deleted":  # pruned by keep_last: its folder is gone
        step = int(event["step"])
        return [lambda s: repository.remove_checkpoint(s, c.job_id, c.lease_token, step)]
    if kind == "sft":
        data = {k: event[k] for k in ("step", "total", "loss")}
        return [event_op(rec, "sft.progress", f"SFT warm-start step {event['step']}/{event['total']}", data)]
    if kind == "resumed":
        step = event["step"]
        return [
            event_op(rec, "trainer.resumed", f"Resumed from the checkpoint at step {step}", {"step": step})
        ]
    if kind == "error":
        rec.last_error = str(event.get("message", ""))
        rec.last_error_event = event
        message = str(event.get("message", "trainer error"))
        logger.error("job %s: trainer error: %s", c.job_id, message)
        return [event_op(rec, "trainer.error", message, {"step": event.get("step")}, level="error")]
    return []


def _samples_op(rec: Recorder, event: dict[str, Any]) -> Operation:
    step, phase = int(event["step"]), str(event["phase"])
    samples = checked_samples(event.get("samples"))
    what = "evaluation" if phase == "eval" else "training"
    data = {"step": step, "phase": phase, "samples": samples}
    return event_op(rec, f"samples.{phase}", f"{len(samples)} {what} samples at step {step}", data)


def _warning_op(rec: Recorder, event: dict[str, Any]) -> Operation:
    step, kind = int(event["step"]), str(event["kind"])
    message = str(event.get("message", ""))
    count, first = event.get("count"), event.get("first_step")
    data = {
        "step": step,
        "kind": kind,
        "count": count if isinstance(count, int) else 1,
        "first_step": first if isinstance(first, int) else step,
    }
    return event_op(rec, f"warning.{kind}", message, data, level="warn")


def event_op(rec: Recorder, kind: str, message: str, data: dict[str, Any], level: str = "info") -> Operation:
    """Append a job event; the dedupe key (attempt, kind, step) makes a retried write a no-op."""
    c = rec.claim
    step = data.get("step")
    dedupe = f"{c.attempt}:{kind}:{step}"
    shown = rec.storage.shown_to_tenant(message, c.tenant_id)
    return lambda s: repository.append_event(
        s,
        c.job_id,
        kind,
        shown,
        data=data,
        level=level,
        step=step if isinstance(step, int) else None,
        lease_token=c.lease_token,
        dedupe_key=dedupe,
    )
