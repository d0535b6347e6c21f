"""The hostile-completion suite (tests/security/completions.py) through the API's dry run, POST
/v1/verifiers/test, for every verifier: each string is scored in the API's child process (service/offload.py)
as training would score it. No code runs (the marker file never appears), every call answers 200 with a
score in [0, 1] (or the example's error) within its budget, and the API stays up.

The trainer's path (trainer.tasks.verifiers.score) with the same strings: tests/security/test_hostile_completions.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.security.completions import hostile_completions
from tests.service.conftest import TenantKey
from trainer.tasks.sources import make_examples
from trainer.tasks.verifiers import VERIFIERS

BUDGET_S = 5.0


def _rg(task: str) -> dict[str, Any]:
    example = make_examples("reasoning_gym", name=task, size=1, seed=0)[0]
    return {"answer": example.answer, "meta": example.meta}


CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "exact": ("exact", {"answer": "46"}, {"extract": "full"}),
    "numeric": ("numeric", {"answer": "0.5"}, {}),
    "math_verify": ("math_verify", {"answer": "\\frac{1}{2}"}, {}),
    "rg_chain_sum": ("reasoning_gym", _rg("chain_sum"), {}),
    "rg_bitwise_arithmetic": ("reasoning_gym", _rg("bitwise_arithmetic"), {}),
    "rg_number_sorting": ("reasoning_gym", _rg("number_sorting"), {"extract": "full"}),
}


def test_the_cases_cover_every_verifier() -> None:
    assert {name for name, _, _ in CASES.values()} == set(VERIFIERS)


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_hostile_completion_runs_code_in_the_dry_run(
    make_client: Callable[..., TestClient], tenant: TenantKey, tmp_path: Path, case: str
) -> None:
    client = make_client(task_check_seconds=BUDGET_S)
    name, example, params = CASES[case]
    marker = tmp_path / "ran"
    warm = {"verifier": {"name": name, "params": params}, "completion": "1", "example": example}
    assert client.post("/v1/verifiers/test", json=warm, headers=tenant.headers).status_code == 200  # spawned
    problems = []
    for label, completion in hostile_completions(str(marker)).items():
        body = {"verifier": {"name": name, "params": params}, "completion": completion, "example": example}
        start = time.monotonic()
        response = client.post("/v1/verifiers/test", json=body, headers=tenant.headers)
        seconds = time.monotonic() - start
        if response.status_code != 200:
            problems.append(f"{label}: {response.status_code} {response.text[:200]}")
        elif response.json()["error"] is not None or not 0.0 <= response.json()["score"] <= 1.0:
            problems.append(f"{label}: {response.json()}")
        if seconds > BUDGET_S:
            problems.append(f"{label}: {seconds:.1f} s")
        if marker.exists():
            problems.append(f"{label}: the marker file was created")
            marker.unlink()
    assert not problems, problems
    assert client.get("/healthz").status_code == 200
