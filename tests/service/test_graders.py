"""POST /v1/graders/validate and /v1/graders/run against the real sandbox and grader environment, the
per-tenant bound, and a job with a grader at submission (its loophole warnings kept in the job view;
refused only when the spec asks). The OpenAI documentation's example graders of each supported type are
accepted as written."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.graders.conftest import grader_environment  # noqa: F401 - the fixture
from tests.service.conftest import TenantKey

ROOT = Path(__file__).resolve().parents[2]
FAST = {"timeout_s": 10, "memory_mb": 1024}

# The example graders of OpenAI's graders guide, as written there (one per supported type).
OPENAI_EXAMPLES: dict[str, dict[str, Any]] = {
    "string_check": {
        "type": "string_check",
        "name": "Example string check grader",
        "input": "{{sample.output_text}}",
        "reference": "{{item.label}}",
        "operation": "eq",
    },
    "text_similarity": {
        "type": "text_similarity",
        "name": "Example text similarity grader",
        "input": "{{sample.output_text}}",
        "reference": "{{item.label}}",
        "pass_threshold": 0.8,
        "evaluation_metric": "fuzzy_match",
    },
    "python": {
        "type": "python",
        "name": "Example python grader",
        "image_tag": "2025-05-08",
        "source": (
            "from rapidfuzz import fuzz, utils\n\n"
            "def grade(sample, item) -> float:\n"
            '    output_text = sample["output_text"]\n'
            '    reference_answer = item["reference_answer"]\n'
            "    return fuzz.WRatio(output_text, reference_answer, processor=utils.default_process) / 100.0\n"
        ),
    },
    "multi": {
        "type": "multi",
        "graders": {
            "name": {
                "name": "name_grader",
                "type": "text_similarity",
                "input": "{{sample.output_json.name}}",
                "reference": "{{item.name}}",
                "evaluation_metric": "fuzzy_match",
                "pass_threshold": 0.9,
            },
            "email": {
                "name": "email_grader",
                "type": "string_check",
                "input": "{{sample.output_json.email}}",
                "reference": "{{item.email}}",
                "operation": "eq",
            },
        },
        "calculate_output": "(name + email) / 2",
    },
}
EXAMPLE_ROWS = {
    "string_check": [({"output_text": "cat"}, {"label": "cat"}), ({"output_text": "dog"}, {"label": "cat"})],
    "text_similarity": [({"output_text": "the cat"}, {"label": "the cat"}), ({"output_text": "xyz"}, {"label": "the cat"})],
    "python": [({"output_text": "Paris"}, {"reference_answer": "Paris"}), ({"output_text": "Rome"}, {"reference_answer": "Paris"})],
    "multi": [
        ({"output_text": json.dumps({"name": "Ada Lovelace", "email": "ada@x.org"})}, {"name": "Ada Lovelace", "email": "ada@x.org"}),
        ({"output_text": json.dumps({"name": "Bob", "email": "bob@y.org"})}, {"name": "Ada Lovelace", "email": "ada@x.org"}),
    ],
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(OPENAI_EXAMPLES))
def test_openai_example_graders_are_accepted_as_written_and_run(
    grader_environment: None,  # noqa: F811
    client: TestClient,
    tenant: TenantKey,
    kind: str,
) -> None:
    grader = OPENAI_EXAMPLES[kind]
    validated = client.post(
        "/v1/graders/validate", json={"grader": grader, "limits": FAST}, headers=tenant.headers
    )
    assert validated.status_code == 200, validated.text
    assert validated.json()["grader"]["type"] == kind
    rows = [{"sample": sample, "item": item} for sample, item in EXAMPLE_ROWS[kind]]
    ran = client.post(
        "/v1/graders/run", json={"grader": grader, "data": rows, "limits": FAST}, headers=tenant.headers
    )
    assert ran.status_code == 200, ran.text
    right, wrong = ran.json()["results"]
    assert right["error"] is None and wrong["error"] is None, ran.text
    assert right["score"] == pytest.approx(1.0) and right["passed"]
    assert wrong["score"] < right["score"] and not wrong["passed"]


def test_a_grader_error_comes_back_with_its_traceback_and_never_as_a_zero(
    grader_environment: None,  # noqa: F811
    client: TestClient,
    tenant: TenantKey,
) -> None:
    source = (
        "def grade(sample, item):\n"
        "    print('looking at', sample['output_text'])\n"
        "    if sample['output_text'] == 'boom':\n"
        "        raise KeyError('no such thing')\n"
        "    if sample['output_text'] == 'nan':\n"
        "        return float('nan')\n"
        "    if sample['output_text'] == 'text':\n"
        "        return 'one'\n"
        "    if sample['output_text'] == 'slow':\n"
        "        import time; time.sleep(60)\n"
        "    return 0.25\n"
    )
    data = [
        {"sample": {"output_text": text}, "item": {"answer": "x"}}
        for text in ("ok", "boom", "nan", "text", "slow", "ok")
    ]
    body = {"grader": {"type": "python", "source": source}, "data": data, "limits": {"timeout_s": 3}}
    start = time.monotonic()
    response = client.post("/v1/graders/run", json=body, headers=tenant.headers)
    assert response.status_code == 200, response.text
    assert time.monotonic() - start < 40  # the sleeper was stopped at its budget
    ok, boom, nan, text, slow, again = response.json()["results"]
    assert ok["score"] == 0.25 and ok["output"] == "looking at ok\n" and ok["error"] is None
    assert boom["score"] is None and boom["error"]["kind"] == "exception"
    assert "KeyError" in boom["error"]["message"] and "raise KeyError" in boom["error"]["traceback"]
    assert nan["score"] is None and nan["error"]["kind"] == "non_finite"
    assert text["score"] is None and text["error"]["kind"] == "not_a_number"
    assert slow["score"] is None and slow["error"]["kind"] == "timeout"
    assert again["score"] == 0.25  # the process after the killed one grades on


@pytest.mark.parametrize(
    ("grader", "param"),
    [
        ({"type": "python", "source": "def grade(sample):\n    return 1.0\n"}, "grader.source"),
        ({"type": "python", "source": "import os\nraise SystemExit(3)\n"}, "grader.source"),
        ({"type": "python", "source": "x = 1\n"}, "grader.source"),
        ({"type": "python", "source": "def grade(a, b):\n    return 1\n" + "#" * 300_000}, "grader.source"),
        ({"type": "multi", "graders": {"a": {"type": "python", "source": "def grade(s, i) return 1"}}, "calculate_output": "a"},
         "grader.graders.a.source"),
        ({"type": "score_model", "name": "x"}, "grader.type"),
        ({"type": "multi", "graders": {"a": {"type": "string_check", "input": "x", "reference": "y", "operation": "eq"}},
          "calculate_output": "__import__('os').system('id')"}, "grader.calculate_output"),
        ({"type": "string_check", "input": "{{sample.secret}}", "reference": "x", "operation": "eq"}, "grader.input"),
    ],
)  # fmt: skip
def test_a_grader_that_does_not_load_is_a_422_naming_the_field(
    grader_environment: None,  # noqa: F811
    client: TestClient,
    tenant: TenantKey,
    grader: dict[str, Any],
    param: str,
) -> None:
    response = client.post(
        "/v1/graders/validate", json={"grader": grader, "limits": FAST}, headers=tenant.headers
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == param, response.text


def test_validate_warns_of_a_substring_check_an_empty_answer_passes(
    grader_environment: None,  # noqa: F811
    client: TestClient,
    tenant: TenantKey,
) -> None:
    loose = {
        "type": "string_check",
        "input": "{{item.answer}}",
        "reference": "{{sample.output_text}}",
        "operation": "like",
    }
    body = {"grader": loose, "items": [{"prompt": "2+2=", "answer": "4"}, {"prompt": "3+3=", "answer": "6"}]}
    response = client.post("/v1/graders/validate", json=body, headers=tenant.headers)
    assert response.status_code == 200, response.text
    messages = [w["message"] for w in response.json()["warnings"]]
    assert any(m.startswith("scores 1 for an empty output (2 of 2 items") for m in messages), messages
    strict = {**loose, "input": "{{sample.output_text}}", "reference": "{{item.answer}}", "operation": "eq"}
    response = client.post("/v1/graders/validate", json={**body, "grader": strict}, headers=tenant.headers)
    assert response.status_code == 200 and response.json()["warnings"] == []


def test_one_tenant_past_its_bound_gets_a_429_and_another_tenant_is_served(
    grader_environment: None,  # noqa: F811
    make_client: Any,
    make_tenant: Any,
) -> None:
    """Three requests at once on the app's own event loop: the tenant's second run is refused while its
    first grades (8 s), and another tenant's run is served meanwhile."""
    client = make_client(grader_runs_per_tenant=1)
    busy, other = make_tenant(), make_tenant()
    slow = {
        "type": "python",
        "source": "import time\ndef grade(s, i):\n    if s['output_text'] == 'x':\n        time.sleep(8)\n    return 1.0\n",
    }
    item = {"prompt": "p", "answer": "a"}
    body = {
        "grader": slow,
        "data": [{"sample": {"output_text": "x"}, "item": item}],
        "limits": {"timeout_s": 20},
    }
    quick = {**body, "grader": {**slow, "source": "def grade(s, i):\n    return 1.0\n"}}

    async def three_at_once() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=120) as http:
            first = asyncio.create_task(http.post("/v1/graders/run", json=body, headers=busy.headers))
            await asyncio.sleep(1.0)  # the first one holds the tenant's slot by now
            second = await http.post("/v1/graders/run", json=body, headers=busy.headers)
            served = await http.post("/v1/graders/run", json=quick, headers=other.headers)
            still_running = not first.done()
            return [await first, second, served, still_running]

    first, second, served, still_running = client.portal.call(three_at_once)
    assert second.status_code == 429 and second.json()["error"]["code"] == "too_many_grader_runs", second.text
    assert served.status_code == 200 and served.json()["results"][0]["score"] == 1.0, served.text
    assert still_running  # the other tenant was served while the first run still graded
    assert first.status_code == 200 and first.json()["results"][0]["score"] == 1.0, first.text


def test_limits_above_the_operators_are_refused_naming_the_field(
    client: TestClient, tenant: TenantKey
) -> None:
    grader = {"type": "python", "source": "def grade(s, i):\n    return 1.0\n"}
    response = client.post(
        "/v1/graders/validate", json={"grader": grader, "limits": {"timeout_s": 121}}, headers=tenant.headers
    )
    assert response.status_code == 422 and response.json()["error"]["param"] == "limits.timeout_s"


def _job_spec(grader: dict[str, Any], **grading: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": "tiny-arith"},
        "task": {"source": "arithmetic", "train_size": 64, "eval_size": 8},
        "grader": grader,
        "optim": {"steps": 2, "prompts_per_step": 2},
    }
    if grading:
        spec["grading"] = grading
    return spec


LOOSE = {
    "type": "string_check",
    "input": "{{item.answer}}",
    "reference": "{{sample.output_text}}",
    "operation": "like",
}


def test_a_job_with_a_grader_keeps_its_loophole_warnings_in_the_job_view(
    client: TestClient, tenant: TenantKey
) -> None:
    created = client.post("/v1/jobs", json={"spec": _job_spec(LOOSE)}, headers=tenant.headers)
    assert created.status_code == 201, created.text
    grader = created.json()["grader"]
    assert grader["type"] == "string_check" and grader["health"] == {}
    assert any(
        w["message"].startswith("scores 1 for an empty output (4 of 4 items") for w in grader["warnings"]
    )
    job = client.get(f"/v1/jobs/{created.json()['id']}", headers=tenant.headers)
    assert job.status_code == 200, job.text
    assert job.json()["grader"]["warnings"] == grader["warnings"]
    events = client.get(f"/v1/jobs/{created.json()['id']}/events", headers=tenant.headers).json()["data"]
    assert events[0]["level"] == "warn" and events[0]["data"]["grader_warnings"] == grader["warnings"]
    plain = client.post("/v1/jobs", json={"spec": {"optim": {"steps": 1}}}, headers=tenant.headers).json()
    assert plain["grader"] is None


def test_a_job_is_refused_on_its_loophole_warnings_only_when_its_spec_asks(
    client: TestClient, tenant: TenantKey
) -> None:
    body = {"spec": _job_spec(LOOSE, refuse_loopholes=True)}
    refused = client.post("/v1/jobs", json=body, headers=tenant.headers)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "grader_loophole" and error["param"] == "spec.grader"
    strict = {**LOOSE, "input": "{{sample.output_text}}", "reference": "{{item.answer}}", "operation": "eq"}
    accepted = client.post(
        "/v1/jobs", json={"spec": _job_spec(strict, refuse_loopholes=True)}, headers=tenant.headers
    )
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["grader"]["warnings"] == []


def test_a_job_whose_grader_does_not_load_is_a_422_naming_its_source(
    grader_environment: None,  # noqa: F811
    client: TestClient,
    tenant: TenantKey,
) -> None:
    broken = {"type": "python", "source": "def grade(sample):\n    return 1.0\n"}
    refused = client.post("/v1/jobs", json={"spec": _job_spec(broken)}, headers=tenant.headers)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["param"] == "spec.grader.source"
    assert refused.json()["error"]["code"] == "grader_error"
    too_long = client.post(
        "/v1/jobs", json={"spec": _job_spec(LOOSE, limits={"timeout_s": 120})}, headers=tenant.headers
    )
    assert too_long.status_code == 201  # at the default ceiling: accepted


def test_fuzzed_formulas_through_the_route_are_a_200_or_a_422_naming_calculate_output(
    client: TestClient, tenant: TenantKey
) -> None:
    """A share of tests/contract/test_grader_formula.py's fuzz (every code-like string and 300 generated
    formulas) through POST /v1/graders/validate: nothing but a 200 or a 422 on grader.calculate_output.
    Each multi grader has the graders its formula names (it must use every one of its own)."""
    from contract import grader_formula
    from tests.contract.test_grader_formula import NAMES, fuzz_formulas

    leaf = {"type": "string_check", "input": "{{sample.output_text}}", "reference": "x", "operation": "eq"}
    statuses: dict[int, int] = {}
    for formula in fuzz_formulas(300, seed=11):
        try:
            names = grader_formula.names_used(grader_formula.parse(formula, NAMES)) or NAMES
        except grader_formula.FormulaError:
            names = NAMES
        body = {
            "grader": {
                "type": "multi",
                "graders": dict.fromkeys(sorted(names), leaf),
                "calculate_output": formula,
            }
        }
        response = client.post("/v1/graders/validate", json=body, headers=tenant.headers)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        if response.status_code == 422:
            assert response.json()["error"]["param"] == "grader.calculate_output", (formula, response.text)
        else:
            assert response.status_code == 200, (formula, response.text)
    assert statuses.get(200, 0) > 20 and statuses.get(422, 0) > 100, statuses
