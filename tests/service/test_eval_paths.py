"""Issue 32's findings against the real API: N4 (tenant text eval()'d by a reasoning-gym scorer in the API
process), N6 (task generation on the event loop stalled every tenant), N7 (generation exceptions were 500s),
and the uploaded-file side of N5 (a line carrying a reasoning-gym entry).

N4 and N5 use a harmless marker: an expression that would create a file; the file must never exist.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import TenantKey
from tests.service.helpers import TINY_SPEC, upload
from tests.service.test_errors import assert_error
from trainer.tasks import rg_safety
from trainer.tasks.sources import make_examples

BUDGET_S = 3.0


def _code(marker: Path) -> str:
    return f"__import__('pathlib').Path({str(marker)!r}).touch()"


def _rg_meta(task: str) -> dict[str, Any]:
    return dict(make_examples("reasoning_gym", name=task, size=1, seed=0)[0].meta["reasoning_gym"])


def _dry_run(client: TestClient, tenant: TenantKey, completion: str, meta: dict[str, Any]) -> Any:
    body = {
        "verifier": {"name": "reasoning_gym"},
        "completion": completion,
        "example": {"answer": "7", "meta": {"reasoning_gym": meta}},
    }
    return client.post("/v1/verifiers/test", json=body, headers=tenant.headers)


# --- N4 ---------------------------------------------------------------------------------------------------


def test_n4_the_probe_body_is_refused_naming_the_entry(
    client: TestClient, tenant: TenantKey, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    probe = {"task": "bitwise_arithmetic", "entry": {"answer": "7", "metadata": {"problem": _code(marker)}}}
    response = _dry_run(client, tenant, "<answer>7</answer>", probe)
    assert_error(response, 422, "forbidden_field", "example.meta.reasoning_gym.entry")
    sorting = {**_rg_meta("number_sorting"), "entry": {"answer": f"[{_code(marker)}]"}}
    assert_error(
        _dry_run(client, tenant, "[1]", sorting), 422, "forbidden_field", "example.meta.reasoning_gym.entry"
    )
    assert not marker.exists()


@pytest.mark.parametrize("task", sorted(set(rg_safety.REFUSED_SCORERS) - {"composite"}))
def test_n4_a_scorer_that_evaluates_the_completion_is_refused_naming_the_task(
    client: TestClient, tenant: TenantKey, tmp_path: Path, task: str
) -> None:
    marker = tmp_path / "ran"
    for completion in (_code(marker), f"<answer>[{_code(marker)}]</answer>", f"x + {_code(marker)}"):
        response = _dry_run(client, tenant, completion, _rg_meta(task))
        assert_error(response, 422, "unsafe_task", "example.meta.reasoning_gym.task")
    assert not marker.exists()


def test_a_rebuilt_entry_still_scores_through_the_dry_run(client: TestClient, tenant: TenantKey) -> None:
    example = make_examples("reasoning_gym", name="bitwise_arithmetic", size=2, seed=4)[1]
    meta = example.meta["reasoning_gym"]
    right = _dry_run(client, tenant, f"<answer>{example.answer}</answer>", meta)
    assert right.status_code == 200, right.text
    assert right.json()["score"] == 1.0 and right.json()["error"] is None
    # a config the allow-list refuses is a 422 naming the field (issue 44, trainer/tasks/rg_config.py)...
    wrong = _dry_run(client, tenant, "1", {**meta, "config": {"difficulty": "x"}})
    assert_error(wrong, 422, "invalid_config", "example.meta.reasoning_gym.config.difficulty")
    # ...one it allows but the generator refuses is the example's error, as in training, in our words
    broken = _dry_run(client, tenant, "1", {**meta, "config": {"difficulty": 0}})
    assert broken.status_code == 200 and broken.json()["error"]["code"] == "example_not_scorable"
    assert broken.json()["error"]["message"] == (
        "reasoning-gym task 'bitwise_arithmetic' cannot generate with this config"
    )


def test_a_job_scoring_a_refused_task_is_a_422_naming_the_task(client: TestClient, tenant: TenantKey) -> None:
    spec = {**TINY_SPEC, "task": {"source": "reasoning_gym", "name": "spiral_matrix"}}
    spec["verifier"] = {"name": "reasoning_gym"}
    response = client.post("/v1/jobs/estimate", json={"spec": spec}, headers=tenant.headers)
    assert_error(response, 422, "unsafe_task", "spec.task.name")
    assert "evaluates the answer" in response.json()["error"]["message"]
    # generating it for another verifier evaluates nothing of the tenant's
    spec["verifier"] = {"name": "exact"}
    assert client.post("/v1/jobs/estimate", json={"spec": spec}, headers=tenant.headers).status_code == 200


# --- N5, the upload -----------------------------------------------------------------------------------------


def test_n5_an_uploaded_line_carrying_an_entry_is_refused_naming_the_field(
    client: TestClient, tenant: TenantKey, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    good = {"prompt": "p", "answer": "0x1", "meta": {"reasoning_gym": _rg_meta("bitwise_arithmetic")}}
    bad = json.loads(json.dumps(good))
    bad["meta"]["reasoning_gym"]["entry"] = {"answer": "0x1", "metadata": {"problem": _code(marker)}}
    refused = {"prompt": "p", "answer": "a", "meta": {"reasoning_gym": _rg_meta("spiral_matrix")}}
    content = "\n".join(json.dumps(line) for line in (good, bad, refused)).encode()
    response = upload(client, tenant.headers, content)
    assert response.status_code == 422, response.text
    errors = {(e["line"], e["code"], e["param"]) for e in response.json()["error"]["details"]}
    assert errors == {
        (2, "forbidden_field", "meta.reasoning_gym.entry"),
        (3, "unsafe_task", "meta.reasoning_gym.task"),
    }
    assert upload(client, tenant.headers, json.dumps(good).encode()).status_code == 201
    assert not marker.exists()


def test_an_uploaded_config_that_does_not_generate_is_a_line_error(
    make_client: Callable[..., TestClient], tenant: TenantKey
) -> None:
    # The trainer rebuilds every entry from the line's task and config: a config that raises or exhausts
    # memory is refused at upload (generated once per distinct config, in the API's child processes).
    client = make_client(task_check_seconds=BUDGET_S, task_check_memory_mb=512)

    def line(task: str, config: dict[str, Any]) -> dict[str, Any]:
        meta = {"task": task, "config": config, "seed": 0, "size": 1, "index": 0}
        return {"prompt": "p", "answer": "a", "meta": {"reasoning_gym": meta}}

    lines = [
        line("chain_sum", {}),
        line("word_ladder", {"min_chain_length": 200, "max_chain_length": 200}),  # IndexError
        line("count_primes", {"max_n": 10_000_000_000}),  # MemoryError
        line("no_such_task", {}),
        line("chain_sum", {}),
    ]
    content = "\n".join(json.dumps(item) for item in lines).encode()
    response = upload(client, tenant.headers, content)
    assert response.status_code == 422, response.text
    errors = {(e["line"], e["code"], e["param"]) for e in response.json()["error"]["details"]}
    # the allow-list (trainer/tasks/rg_config.py) answers first, naming the field, before anything generates
    assert errors == {
        (3, "invalid_config", "meta.reasoning_gym.config.max_n"),
        (4, "invalid_meta", "meta.reasoning_gym.task"),
    }
    content = "\n".join(json.dumps(item) for item in lines[:2]).encode()
    response = upload(client, tenant.headers, content)
    assert response.status_code == 422, response.text
    errors = {(e["line"], e["code"], e["param"]) for e in response.json()["error"]["details"]}
    assert errors == {(2, "invalid_meta", "meta.reasoning_gym.config")}
    good = "\n".join(json.dumps(item) for item in (lines[0], lines[4])).encode()
    assert upload(client, tenant.headers, good).status_code == 201


# --- N6 and N7 --------------------------------------------------------------------------------------------


def _estimate(client: TestClient, tenant: TenantKey, name: str, params: dict[str, Any]) -> Any:
    spec = {**TINY_SPEC, "task": {"source": "reasoning_gym", "name": name, "params": params}}
    return client.post("/v1/jobs/estimate", json={"spec": spec}, headers=tenant.headers)


def test_n6_a_task_that_never_generates_stalls_no_one_and_ends_in_a_422(
    make_client: Callable[..., TestClient], make_tenant: Callable[[], TenantKey]
) -> None:
    client = make_client(task_check_seconds=BUDGET_S)
    attacker, other = make_tenant(), make_tenant()
    assert _estimate(client, attacker, "chain_sum", {}).status_code == 200  # the child is warm
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        start = time.monotonic()
        hung = pool.submit(_estimate, client, attacker, "puzzle24", {"min_value": 1, "max_value": 1})
        time.sleep(0.3)  # the estimate is in its child by now
        latencies = []
        while not hung.done() and time.monotonic() - start < BUDGET_S + 10:
            sent = time.monotonic()
            assert client.get("/v1/jobs", headers=other.headers).status_code == 200
            latencies.append(time.monotonic() - sent)
            time.sleep(0.05)
        response = hung.result(timeout=BUDGET_S + 10)
        elapsed = time.monotonic() - start
    assert_error(response, 422, "budget_exceeded", "spec.task.params")
    assert f"budget of {BUDGET_S:g} s" in response.json()["error"]["message"]
    assert BUDGET_S <= elapsed < BUDGET_S + 3.0
    assert len(latencies) >= 10 and max(latencies) < 0.1, latencies
    # the killed child was replaced: the next estimate answers
    assert _estimate(client, other, "chain_sum", {}).status_code == 200


@pytest.mark.parametrize(
    ("name", "params", "code", "param"),
    [
        # refused by the allow-list (issue 44, trainer/tasks/rg_config.py), naming the field
        ("composite", {"datasets": "x"}, "forbidden_field", "spec.task.params.datasets"),
        ("count_primes", {"max_n": 10_000_000_000}, "invalid_config", "spec.task.params.max_n"),
        # allowed, and the generator raises (IndexError) in its child
        (
            "word_ladder",
            {"min_chain_length": 200, "max_chain_length": 200},
            "invalid_spec",
            "spec.task.params",
        ),
    ],
)
def test_n7_every_generation_failure_is_a_4xx_naming_the_params(
    make_client: Callable[..., TestClient],
    tenant: TenantKey,
    name: str,
    params: dict[str, Any],
    code: str,
    param: str,
) -> None:
    client = make_client(task_check_seconds=BUDGET_S, task_check_memory_mb=512)
    response = _estimate(client, tenant, name, params)
    assert_error(response, 422, code, param)
    assert "Error" not in response.json()["error"]["message"]  # our words, not the generator's
