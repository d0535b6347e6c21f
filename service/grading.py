"""Tenant graders on the API's side (docs/GRADERS.md): validating a grader, running it on samples, and the
loophole check of a job with a grader at submission. The grader's code never runs in this process: python
and text_similarity graders run in the sandboxed grader pool (trainer/graders/pool.py), started here for
one request and ended with it (never shared between requests, tenants or jobs); string_check and the multi
formula are plain data operations.

Off the event loop: each run is a blocking call in a worker thread, at most `grader_runs_total` at once
over the API (the rest wait for a thread without holding one), and at most `grader_runs_per_tenant` in
flight per tenant: one more is a 429 `too_many_grader_runs`, so one tenant's slow graders delay only
itself.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import anyio
import anyio.to_thread

from contract.graders import (
    AnyGrader,
    GraderError,
    GraderLimitsSpec,
    GradingSpec,
    PythonGrader,
    leaves,
    parse_grader,
)
from contract.spec import TrainSpec
from service.errors import TooManyRequests, Unavailable, Unprocessable
from trainer.graders import loopholes
from trainer.graders.grading import Grader, Outcome
from trainer.graders.pool import GraderSetupError, GraderUnavailable

LOOPHOLE_ITEMS = 4  # dataset rows a job's loophole check grades (the first ones of its task)


class GraderGate:
    """Grader runs in flight: per tenant (a bound, past which a 429) and over the API (threads)."""

    def __init__(self, per_tenant: int, total: int) -> None:
        self.per_tenant = per_tenant
        self.limiter = anyio.CapacityLimiter(total)
        self._running: dict[str, int] = {}
        self._lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def slot(self, tenant_id: str) -> AsyncIterator[None]:
        with self._lock:
            running = self._running.get(tenant_id, 0)
            if running >= self.per_tenant:
                raise TooManyRequests(
                    f"the tenant has {running} grader runs in flight (limit {self.per_tenant}); retry when one ends",
                    retry_after_s=5,
                    code="too_many_grader_runs",
                )
            self._running[tenant_id] = running + 1
        try:
            yield
        finally:
            with self._lock:
                self._running[tenant_id] -= 1
                if not self._running[tenant_id]:
                    del self._running[tenant_id]

    async def run(self, tenant_id: str, function: Any, *args: Any) -> Any:
        async with self.slot(tenant_id):
            return await anyio.to_thread.run_sync(function, *args, limiter=self.limiter)


def parsed(data: Any, where: str = "grader") -> AnyGrader:
    """The grader object of a request, or a 422 naming its field."""
    try:
        return parse_grader(data, where)
    except GraderError as err:
        raise Unprocessable(err.message, param=err.field, code="invalid_grader") from None


def limits_within(limits: GraderLimitsSpec, maxima: Mapping[str, float], where: str) -> GraderLimitsSpec:
    """The limits, or a 422 naming the field past this deployment's maximum (STARE_GRADER_MAX_*)."""
    for field, maximum in maxima.items():
        value = getattr(limits, field)
        if value > maximum:
            raise Unprocessable(
                f"{where}.{field} is {value:g}, above this deployment's limit {maximum:g} "
                f"(STARE_GRADER_MAX_{field.upper()})",
                param=f"{where}.{field}",
                code="exceeds_limit",
            )
    return limits


def _source_field(grader: AnyGrader, name: str, where: str) -> str:
    if name and isinstance(leaves(grader).get(name), PythonGrader):
        return f"{where}.graders.{name}.source"
    return f"{where}.source"


def start(grader: AnyGrader, limits: GraderLimitsSpec, workers: int, where: str = "grader") -> Grader:
    """The grader with its pool started (blocking), or a 422 `grader_error` naming the source that did
    not load (with its traceback), or a 503 when this server has no grader environment."""
    try:
        return Grader.start(grader, limits, workers)
    except GraderSetupError as err:
        message = str(err) + (f"\n{err.traceback[-2000:]}" if err.traceback else "")
        raise Unprocessable(
            message, param=_source_field(grader, err.name, where), code="grader_error"
        ) from None
    except GraderUnavailable as err:
        raise Unavailable(f"graders cannot run on this server: {err}", code="graders_unavailable") from None


def outcome_view(outcome: Outcome, threshold: float) -> dict[str, Any]:
    error = None
    if outcome.error is not None:
        error = {"kind": outcome.error, "message": outcome.message, "traceback": outcome.traceback or None}
    passed = outcome.score is not None and outcome.score >= threshold
    return {"score": outcome.score, "passed": passed, "error": error, "output": outcome.output,
            "seconds": outcome.seconds}  # fmt: skip


def validate_blocking(
    grader: AnyGrader, items: Sequence[dict[str, Any]], limits: GraderLimitsSpec
) -> list[Any]:
    """Loads the grader in its sandbox and runs the loophole check on `items` (blocking)."""
    started = start(grader, limits, 1)
    try:
        return [finding.to_dict() for finding in loopholes.check(started, items)]
    finally:
        started.close()


def run_blocking(
    grader: AnyGrader, rows: Sequence[tuple[str, dict[str, Any]]], limits: GraderLimitsSpec, workers: int
) -> tuple[list[dict[str, Any]], list[Any]]:
    """(each row's outcome, the loophole findings over the rows' items), blocking."""
    started = start(grader, limits, workers)
    try:
        outcomes = started.grade([text for text, _ in rows], [item for _, item in rows])
        distinct: list[dict[str, Any]] = []
        for _, item in rows:
            if item not in distinct:
                distinct.append(item)
        findings = [finding.to_dict() for finding in loopholes.check(started, distinct)]
        return [outcome_view(o, started.threshold) for o in outcomes], findings
    finally:
        started.close()


def job_items(spec: TrainSpec, lines: Sequence[bytes]) -> list[dict[str, Any]]:
    """The items a job's loophole check grades: the first JSONL lines of its file (already checked by the
    upload), as graders see them (prompt, answer, the meta's fields)."""
    items = []
    for raw in lines:
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if (
            isinstance(record, dict)
            and isinstance(record.get("prompt"), str)
            and isinstance(record.get("answer"), str)
        ):
            meta = record.get("meta")
            fields = dict(meta) if isinstance(meta, dict) else {}
            items.append({**fields, "prompt": record["prompt"], "answer": record["answer"]})
    return items


async def job_findings(spec: TrainSpec, storage_key: str | None, tenant_id: str, services: Any) -> list[Any]:
    """The loophole findings of a job with a grader (its source loaded in the sandbox first), on the
    first LOOPHOLE_ITEMS items of its task: an uploaded file's first lines, or generated examples (in the
    task-check children, service/offload.py)."""
    if storage_key is not None:
        lines = await anyio.to_thread.run_sync(_first_lines, services.storage, storage_key, LOOPHOLE_ITEMS)
        items = job_items(spec, lines)
    else:
        task = spec.task
        args = (task.source, task.name, spec.seed, dict(task.params), LOOPHOLE_ITEMS)
        items = await services.offload.run("items", *args, phase="spec.task.params", tenant=tenant_id)
    return list(await services.graders.run(tenant_id, check_job_blocking, spec, items))


def _first_lines(storage: Any, key: str, count: int) -> list[bytes]:
    lines: list[bytes] = []
    with storage.open(key) as fh:
        for raw in fh:
            if raw.strip():
                lines.append(raw[:1_000_000])
            if len(lines) >= count:
                break
    return lines


def check_job_blocking(spec: TrainSpec, items: Sequence[dict[str, Any]]) -> list[Any]:
    """A job's grader loads and its loophole findings on the task's first items (blocking); 422 naming
    spec.grader… when it does not load, or on a finding when the spec refuses them."""
    assert spec.grader is not None
    grading = spec.grading or GradingSpec()
    started = start(spec.grader, grading.limits, 1, where="spec.grader")
    try:
        findings = [finding.to_dict() for finding in loopholes.check(started, items)]
    finally:
        started.close()
    if findings and grading.refuse_loopholes:
        raise Unprocessable(
            f"the grader {findings[0]['message']} (and {len(findings) - 1} more warning(s)); the spec refuses "
            "a grader with loophole warnings (grading.refuse_loopholes)",
            param="spec.grader",
            code="grader_loophole",
            details=[{"param": "spec.grader", "message": f["message"]} for f in findings],
        )
    return findings
