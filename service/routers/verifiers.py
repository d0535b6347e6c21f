"""The fixed registry of answer verifiers, and a dry run of one on a sample."""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter

from service.dependencies import CurrentTenant
from service.errors import Unprocessable
from service.schemas import (
    AUTHENTICATED_ERRORS,
    VerifierList,
    VerifierObject,
    VerifierTest,
    VerifierTestError,
    VerifierTestResult,
)
from trainer import verifiers
from trainer.tasks import Example

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
def test_verifier(body: VerifierTest, _: CurrentTenant) -> VerifierTestResult:
    """Score one completion against one example, exactly as training would. An example the verifier cannot
    score (e.g. a non-numeric reference for `numeric`) is reported in `error`, not as a reward of 0."""
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
    example = Example(prompt=body.example.prompt, answer=body.example.answer, meta=dict(body.example.meta))
    start = time.perf_counter()
    score: float | None = None
    error = None
    try:
        score = verifiers.score(name, body.completion, example, params)
    except ValueError as err:  # VerifierError: this example cannot be scored by this verifier
        error = VerifierTestError(code="example_not_scorable", message=str(err))
    except Exception as err:  # a verifier's own failure on odd input: report it, as training would log it
        logger.warning("verifier %s raised on a dry run", name, exc_info=True)
        error = VerifierTestError(code="verifier_error", message=f"{type(err).__name__}: {err}")
    latency_ms = (time.perf_counter() - start) * 1000
    reward = verifiers.shape_reward(score, body.reward_style) if score is not None else None
    return VerifierTestResult(
        verifier=name, params=params, score=score, reward=reward, latency_ms=latency_ms, error=error
    )
