"""From a job request to a TrainSpec the worker can run, or one 422 naming every offending field.

The spec is validated by the model the trainer runs it with (contract.spec.TrainSpec), then checked against
what this server offers: the model must be in the catalogue (a user cannot point the worker at a path or a
hub id), the verifier and its params must exist, the task must exist, its scorer must evaluate no answer
(trainer/tasks/rg_safety.py) and it must generate with its params (`check_generation`, in a child process), and a
JSONL task must come from an uploaded file (`training_file`): `task.path` is set by the service, never by
the user, and is a key relative to the artifact root.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from pydantic import ValidationError

from contract import verifiers
from contract.catalog import BUILTIN_MODELS, TINY_ARITH
from contract.spec import TrainSpec
from contract.spec_problems import SpecProblem, in_field_order, spec_problems, unknown_name_problems
from contract.suggest import nearest
from service.errors import ServiceError, TooManyRequests, Unavailable, Unprocessable
from service.offload import BudgetExceeded, CallError, ChildFailed, ChildPool, QueueBusy
from service.offload import Unavailable as PoolUnavailable
from store.models import File
from trainer.tasks import rg_config, rg_safety, sources

MAX_PROBLEMS_IN_MESSAGE = 10  # the rest are in details


def model_catalogue(extra_models: Mapping[str, str]) -> dict[str, tuple[str, bool]]:
    """name → (description, built in) for every model a job may name."""
    models = {name: (description, True) for name, description in BUILTIN_MODELS.items()}
    models.update({name: (description, False) for name, description in extra_models.items()})
    return models


def validate_spec(
    raw: Mapping[str, Any],
    *,
    training_file: File | SimpleNamespace | None,
    models: Mapping[str, Any],
    tool_limits: Mapping[str, float] | None = None,
) -> TrainSpec:
    """The TrainSpec of a request's `spec` (with the uploaded file filled in), or Unprocessable listing
    every problem of the spec at once (`spec_invalid`): its fields, its verifier and its model. Whether the
    fleet can run it is placement's question (service/fleet.py), asked after this. `tool_limits` the most a
    tool call may use (settings.tool_limits(): field under spec.environment -> the operator's maximum)."""
    data = dict(raw)  # a shallow copy: only the task is changed, and _place_training_file copies it first
    _place_training_file(data, training_file)
    problems = _verifier_problems(data.get("verifier"))
    spec = None
    try:
        spec = TrainSpec.model_validate(data)
    except ValidationError as err:
        found = spec_problems(err, TrainSpec)
        if problems:  # TrainSpec names the same verifier problem at the spec's root
            found = [p for p in found if not p.field.startswith("verifier")]
        problems += found
    except ValueError as err:  # a validator outside pydantic's wrapping (defensive)
        problems.append(SpecProblem("", str(err), "invalid_value"))
    problems += _model_problems(data.get("model"), models, problems)
    if problems or spec is None:
        raise spec_invalid(
            in_field_order(problems, TrainSpec) or [SpecProblem("", "invalid spec", "invalid_value")]
        )
    _check_task(spec)
    if tool_limits is not None:
        _check_tool_limits(spec, tool_limits)
    return spec


def spec_invalid(problems: list[SpecProblem]) -> Unprocessable:
    """One 422 for every problem of a spec: `details` lists each (field, param, message, code, suggestion),
    the message says them all; `param` and `code` are the first's (a lone unknown model is unknown_model)."""
    details = [p.detail("spec") for p in problems]
    first = problems[0]
    lines = [f"{d['field']}: {d['message']}" for d in details[:MAX_PROBLEMS_IN_MESSAGE]]
    more = len(details) - MAX_PROBLEMS_IN_MESSAGE
    if more > 0:
        lines.append(f"and {more} more (see details)")
    message = lines[0] if len(details) == 1 else f"{len(details)} problems in the spec: " + " | ".join(lines)
    return Unprocessable(
        message,
        param=details[0]["param"],
        code=first.error_code if len(problems) == 1 else "invalid_spec",
        details=details,
    )


def _model_problems(model: Any, models: Mapping[str, Any], found: list[SpecProblem]) -> list[SpecProblem]:
    """The model must be in this server's catalogue (checked on the request, so it is said with the rest)."""
    name = model.get("name", TINY_ARITH) if isinstance(model, dict) else None
    if not isinstance(name, str) or name in models or any(p.field.startswith("model.name") for p in found):
        return []
    suggestion = nearest(name, models)
    hint = f"; did you mean `{suggestion}`?" if suggestion else ""
    message = f"unknown model {name!r}{hint} (available: {', '.join(sorted(models))}; GET /v1/models)"
    return [SpecProblem("model.name", message, "invalid_value", suggestion, error_code="unknown_model")]


def _check_tool_limits(spec: TrainSpec, allowed: Mapping[str, float]) -> None:
    """A tool-use job's limits within the operator's (STARE_TOOL_MAX_*), else 422 naming the field."""
    if spec.environment is None:
        return
    for field, maximum in allowed.items():
        value: Any = spec.environment
        for part in field.split("."):
            value = getattr(value, part)
        if value > maximum:
            setting = "STARE_TOOL_MAX_" + field.rsplit(".", 1)[-1].upper()
            raise Unprocessable(
                f"environment.{field} is {value:g}, above this deployment's limit {maximum:g} ({setting})",
                param=f"spec.environment.{field}",
                code="exceeds_limit",
            )


def _place_training_file(data: dict[str, Any], training_file: File | SimpleNamespace | None) -> None:
    task = data.get("task")
    if isinstance(task, dict) and "path" in task:
        raise Unprocessable(
            "task.path is set by the service: upload the file (POST /v1/files) and pass its id as training_file",
            param="spec.task.path",
            code="invalid_spec",
        )
    if training_file is None:
        if isinstance(task, dict) and task.get("source") == "jsonl":
            raise Unprocessable(
                "task.source 'jsonl' reads an uploaded file: pass its id as training_file",
                param="training_file",
                code="invalid_spec",
            )
        return
    if task is None:
        task = data["task"] = {}
    if not isinstance(task, dict):
        return  # TrainSpec reports the type error with its location
    if task.get("source", "jsonl") != "jsonl":
        raise Unprocessable(
            f"training_file needs task.source 'jsonl', not {task.get('source')!r}",
            param="training_file",
            code="invalid_spec",
        )
    task = data["task"] = dict(task)  # never change the request's own dict (it is stored as submitted)
    task["source"] = "jsonl"
    task["path"] = training_file.storage_key


def _verifier_problems(verifier: Any) -> list[SpecProblem]:
    """The verifier's name and params, named precisely (TrainSpec reports these at the spec's root)."""
    if not isinstance(verifier, dict):
        return []
    name = verifier.get("name", "exact")
    if isinstance(name, str) and name not in verifiers.VERIFIER_PARAMS:
        valid = sorted(verifiers.VERIFIER_PARAMS)
        suggestion = nearest(name, valid)
        hint = f"; did you mean `{suggestion}`?" if suggestion else ""
        message = f"unknown verifier {name!r}{hint} (valid: {', '.join(valid)}; GET /v1/verifiers)"
        return [SpecProblem("verifier.name", message, "invalid_value", suggestion, "unknown_verifier")]
    params = verifier.get("params", {})
    if isinstance(name, str) and isinstance(params, dict):
        try:
            verifiers.validate_params(name, params)
        except ValueError as err:
            return unknown_name_problems("verifier.params", str(err)) or [
                SpecProblem("verifier.params", str(err), "invalid_value")
            ]
    return []


def _check_task(spec: TrainSpec) -> None:
    """The task exists and its scorer evaluates no answer (generating it is `check_generation`)."""
    task = spec.task
    try:
        sources.validate_template(task.prompt_template)
    except ValueError as err:
        raise Unprocessable(str(err), param="spec.task.prompt_template", code="invalid_spec") from None
    if task.source == "jsonl":
        return
    if task.source == "reasoning_gym":
        try:
            sources.check_reasoning_gym_task(task.name or "")
        except ImportError:
            raise Unprocessable(
                "reasoning-gym tasks are not installed on this server",
                param="spec.task.source",
                code="unknown_task",
            ) from None
        except ValueError as err:
            raise Unprocessable(str(err), param="spec.task.name", code="unknown_task") from None
        refused = rg_safety.refusal(task.name or "")
        if refused is not None and spec.verifier.name == "reasoning_gym":
            raise Unprocessable(refused, param="spec.task.name", code="unsafe_task")
        try:  # the allow-list of the task's config fields: no path or free text reaches the generator
            rg_config.check_config(task.name or "", task.params, "spec.task.params")
        except rg_config.ConfigError as err:
            raise Unprocessable(str(err), param=err.field, code=err.code) from None


async def check_generation(spec: TrainSpec, pool: ChildPool, *, tenant: str = "") -> None:
    """The task's params generate an example (so a bad task is a 422 now, not a failed job), in a child
    process within its budget (service/offload.py): any exception, a budget overrun or a crash of the
    generator is a 422 naming spec.task.params, in our words (never the generator's: issue 44, R1). A
    tenant's checks run one at a time (more waiting than the pool's queue: 429)."""
    task = spec.task
    if task.source == "jsonl":
        return
    args = (task.source, task.name, spec.seed, dict(task.params))
    try:
        await pool.run("generate", *args, phase="spec.task.params", tenant=tenant)
    except CallError as err:
        raise Unprocessable(str(err), param="spec.task.params", code="invalid_spec") from None
    except BudgetExceeded as err:
        message = f"generating task {task.name or task.source!r} with these params: {err}"
        raise Unprocessable(message, param="spec.task.params", code="budget_exceeded") from None
    except ChildFailed as err:
        message = f"generating task {task.name or task.source!r} with these params failed: {err}"
        raise Unprocessable(message, param="spec.task.params", code="invalid_spec") from None
    except (QueueBusy, PoolUnavailable) as err:
        raise pool_refusal(err) from None


def pool_refusal(err: QueueBusy | PoolUnavailable) -> ServiceError:
    """A full tenant queue is a 429 (retry), a pool that cannot run here a 503 (the server's fault)."""
    if isinstance(err, QueueBusy):
        return TooManyRequests(f"task checks: {err}", retry_after_s=5, code="task_checks_busy")
    return Unavailable(str(err), code="task_checks_unavailable", retry_after_s=60)


def canonical_hash(value: Any) -> str:
    return hashlib.sha256(
        json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode("utf-8")
    ).hexdigest()
