"""The fixed registry of answer verifiers, and a dry run of one on a sample (in a child process)."""

from __future__ import annotations

import logging

from fastapi import APIRouter

from service import job_specs
from service.dependencies import CurrentTenant, ServicesDep
from service.errors import Unprocessable
from service.offload import BudgetExceeded, CallError, ChildFailed, QueueBusy
from service.offload import Unavailable as PoolUnavailable
from service.schemas import (
    AUTHENTICATED_ERRORS,
    VerifierList,
    VerifierObject,
    VerifierTest,
    VerifierTestError,
    VerifierTestResult,
)
from trainer.tasks import rg_safety, verifiers
from trainer.tasks.sources import REASONING_GYM_META_KEY

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/verifiers", tags=["catalogue"], responses=AUTHENTICATED_ERRORS)


@router.get("", summary="List verifiers", response_model=VerifierList)
def list_verifiers(_: CurrentTenant) -> VerifierList:
    """Every verifier a job can use (`spec.verifier.name`), with its parameters, types and defaults. Reward
    code cannot be uploaded: verifiers come from this registry only."""
    return VerifierList(
        data=[
            VerifierObject.model_validate(spec.to_dict()) for _, spec in sorted(verifiers.VERIFIERS.items())
        ]
    )


@router.post("/test", summary="Dry-run a verifier", response_model=VerifierTestResult)
async def test_verifier(
    body: VerifierTest, tenant: CurrentTenant, services: ServicesDep
) -> VerifierTestResult:
    """Score one completion against one example, exactly as training would, in a child process within a
    time and memory budget (422 `budget_exceeded` naming the field past it). An example the verifier cannot
    score (e.g. a non-numeric reference for `numeric`) is reported in `error`, not as a reward of 0. A
    reasoning-gym example carries `meta.reasoning_gym = {task, config, seed, size, index}`: the entry is
    rebuilt by the server's generator, never taken from the request (422 naming `entry`)."""
    name = body.verifier.name
    if name not in verifiers.VERIFIERS:
        raise Unprocessable(
            f"unknown verifier {name!r}; valid: {', '.join(sorted(verifiers.VERIFIERS))}",
            param="verifier.name",
            code="unknown_verifier",
        )
    try:
        params = verifiers.validate_params(name, body.verifier.params)
    except ValueError as err:
        raise Unprocessable(str(err), param="verifier.params") from None
    meta = dict(body.example.meta)
    if REASONING_GYM_META_KEY in meta:
        try:
            rg_safety.check_meta(meta[REASONING_GYM_META_KEY], where="example.meta.reasoning_gym")
        except rg_safety.MetaError as err:
            raise Unprocessable(str(err), param=err.field, code=err.code) from None
    example = {"prompt": body.example.prompt, "answer": body.example.answer, "meta": meta}
    try:
        outcome = await services.offload.run(
            "score", name, body.completion, example, params, phase="completion", tenant=tenant.id
        )
    except (QueueBusy, PoolUnavailable) as err:
        raise job_specs.pool_refusal(err) from None
    except (BudgetExceeded, ChildFailed) as err:
        raise Unprocessable(
            f"{err.phase}: scoring stopped: {err}", param=err.phase, code="budget_exceeded"
        ) from None
    except CallError as err:  # the scoring harness itself failed, not the verifier (that is `error` below)
        logger.warning("verifier %s failed in its child process: %s", name, err)
        raise Unprocessable(f"{err.phase}: {err}", param=err.phase, code="verifier_error") from None
    score = outcome["score"]
    error = VerifierTestError(**outcome["error"]) if outcome["error"] else None
    reward = verifiers.shape_reward(score, body.reward_style) if score is not None else None
    return VerifierTestResult(
        verifier=name,
        params=params,
        score=score,
        reward=reward,
        latency_ms=outcome["latency_ms"],
        error=error,
    )
