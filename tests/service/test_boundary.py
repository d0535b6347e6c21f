"""The request boundary (service.boundary, contract.safejson) on the real app and PostgreSQL: NUL characters,
non-finite numbers, deep and huge JSON, bad Last-Event-ID and over-capacity jobs each get a 4xx that names
the field, and change nothing."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from contract import safejson
from store import repository
from store.database import Database
from tests.service.conftest import TenantKey
from tests.service.helpers import GOOD_JSONL, TINY_SPEC, create_job, upload


def _job_count(db: Database, tenant: TenantKey) -> int:
    return asyncio.run(repository.count_active_jobs(db.async_pool, tenant.tenant_id))


def _error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def _spec_with(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(TINY_SPEC)
    *parents, last = path.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return spec


# ------------------------------------------------------------------------------------------- NUL characters


def test_nul_in_path_ids_is_refused_naming_the_parameter(client: TestClient, tenant: TenantKey) -> None:
    job_id = create_job(client, tenant.headers)
    for url, param in [
        ("/v1/jobs/%00", "job_id"),
        ("/v1/jobs/job_%00abc/events", "job_id"),
        ("/v1/files/file_%00", "file_id"),
        (f"/v1/jobs/{job_id}/checkpoints/ckpt_%00", "checkpoint_id"),
        ("/v1/api-keys/%00", "key_id"),
        ("/v1/no-such-route/%00", "path"),
    ]:
        error = _error(client.get(url, headers=tenant.headers), 422)
        assert error["code"] == "invalid_characters", url
        assert error["param"] == param, url
        assert "NUL" in error["message"]


def test_nul_in_query_parameters_and_headers_is_refused(client: TestClient, tenant: TenantKey) -> None:
    error = _error(client.get("/v1/jobs?after=%00", headers=tenant.headers), 422)
    assert (error["code"], error["param"]) == ("invalid_characters", "after")
    error = _error(client.get("/v1/jobs?x%00y=1", headers=tenant.headers), 422)
    assert error["param"] == "x\\x00y"  # the name is escaped, never echoed raw
    before = _job_count(client.app.state.services.db, tenant)  # type: ignore[attr-defined]
    response = client.post(
        "/v1/jobs",
        json={"spec": TINY_SPEC},
        headers={**tenant.headers, "Idempotency-Key": "k\x00ey"},
    )
    error = _error(response, 400)
    assert (error["code"], error["param"]) == ("invalid_header", "idempotency-key")
    assert _job_count(client.app.state.services.db, tenant) == before  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"spec": _spec_with("name", "a\x00b")}, "spec.name"),
        ({"spec": TINY_SPEC, "metadata": {"team": "x\x00"}}, "metadata.team"),
        ({"spec": TINY_SPEC, "metadata": {"te\x00am": "x"}}, "metadata.te\\x00am"),
        ({"spec": _spec_with("task.prompt_template", "{prompt}\x00")}, "spec.task.prompt_template"),
        ({"spec": _spec_with("name", "\ud800")}, "spec.name"),  # a lone surrogate cannot be stored either
    ],
)
def test_nul_in_a_job_body_is_refused_and_nothing_is_created(
    client: TestClient, tenant: TenantKey, body: dict[str, Any], param: str
) -> None:
    db = client.app.state.services.db  # type: ignore[attr-defined]
    before = _job_count(db, tenant)
    raw = json.dumps(body)  # \u0000 and \ud800 escapes, as any JSON encoder writes them
    for url in ("/v1/jobs/estimate", "/v1/jobs"):
        response = client.post(
            url, content=raw, headers={**tenant.headers, "Content-Type": "application/json"}
        )
        error = _error(response, 422)
        assert error["param"] == param
        assert error["code"] in ("nul_character", "invalid_unicode")
    assert _job_count(db, tenant) == before


def test_nul_in_an_api_key_name_is_refused(client: TestClient, tenant: TenantKey) -> None:
    error = _error(client.post("/v1/api-keys", json={"name": "ci\x00"}, headers=tenant.headers), 422)
    assert (error["code"], error["param"]) == ("nul_character", "name")
    names = [k["name"] for k in client.get("/v1/api-keys", headers=tenant.headers).json()["data"]]
    assert names == ["test"]


# ------------------------------------------------------------------------------------- non-finite numbers


@pytest.mark.parametrize("literal", ["Infinity", "-Infinity", "NaN", "1e999"])
@pytest.mark.parametrize("field", ["optim.grad_clip", "entropy_band.high"])
def test_non_finite_numbers_get_the_same_answer_from_estimate_and_create(
    client: TestClient, tenant: TenantKey, literal: str, field: str
) -> None:
    db = client.app.state.services.db  # type: ignore[attr-defined]
    before = _job_count(db, tenant)
    raw = json.dumps({"spec": _spec_with(field, 12345.5)}).replace("12345.5", literal)
    answers = []
    for url in ("/v1/jobs/estimate", "/v1/jobs"):
        response = client.post(
            url, content=raw, headers={**tenant.headers, "Content-Type": "application/json"}
        )
        error = _error(response, 422)
        answers.append((error["code"], error["param"]))
    assert answers == [("non_finite_number", f"spec.{field}")] * 2
    assert _job_count(db, tenant) == before


# ----------------------------------------------------------------------------------- deep and huge JSON


def test_deep_or_huge_json_bodies_are_refused(client: TestClient, tenant: TenantKey) -> None:
    headers = {**tenant.headers, "Content-Type": "application/json"}
    deep = '{"spec": {}, "metadata": {"a": ' + "[" * 5_000 + "]" * 5_000 + "}}"
    error = _error(client.post("/v1/jobs", content=deep, headers=headers), 422)
    assert error["code"] == "too_deep"
    # past max_json_values (10,000) a body is refused before its nesting is even measured (issue 44, R3)
    deeper = '{"spec": {}, "metadata": {"a": ' + "[" * 100_000 + "]" * 100_000 + "}}"
    error = _error(client.post("/v1/jobs", content=deeper, headers=headers), 422)
    assert (error["code"], error["param"]) == ("too_many_values", None)
    shallow_but_past_limit = '{"spec": {}, "metadata": ' + '{"a": ' * 40 + "1" + "}" * 40 + "}"
    error = _error(client.post("/v1/jobs", content=shallow_but_past_limit, headers=headers), 422)
    assert error["code"] == "too_deep"
    assert error["param"].startswith("metadata.a.a")
    huge = '{"spec": {"seed": ' + "7" * 5000 + "}}"
    error = _error(client.post("/v1/jobs", content=huge, headers=headers), 422)
    assert (error["code"], error["param"]) == ("integer_too_large", "spec.seed")


@pytest.mark.parametrize(
    ("line", "code", "field"),
    [
        (
            b'{"prompt": "1+1=", "answer": "2", "meta": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
            "too_deep",
            None,  # past Python's own recursion limit: refused without its place
        ),
        (
            b'{"prompt": "1+1=", "answer": "2", "meta": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "too_many_values",
            None,
        ),
        (
            b'{"prompt": "1+1=", "answer": "2", "meta": {"n": ' + b"9" * 5000 + b"}}",
            "integer_too_large",
            "meta.n",
        ),
        (b'{"prompt": "1+1=\\u0000", "answer": "2"}', "nul_character", "prompt"),
        (b'{"prompt": "1+1=", "answer": "2", "meta": {"x": NaN}}', "non_finite_number", "meta.x"),
    ],
)
def test_dataset_lines_breaking_the_rules_are_refused_with_their_line(
    client: TestClient, tenant: TenantKey, line: bytes, code: str, field: str | None
) -> None:
    response = upload(client, tenant.headers, GOOD_JSONL + line + b"\n")
    error = _error(response, 422)
    assert error["code"] == "invalid_file"
    assert error["details"] == [
        {"line": 3, "code": code, "message": error["details"][0]["message"], "param": field}
    ]
    assert client.get("/v1/files", headers=tenant.headers).json()["data"] == []


# ------------------------------------------------------------------------------------- SSE Last-Event-ID


def test_last_event_id_must_be_an_ascii_id_in_range(client: TestClient, tenant: TenantKey) -> None:
    job_id = create_job(client, tenant.headers)
    url = f"/v1/jobs/{job_id}/events?stream=true"
    for value in ["\u0663".encode(), "\u00b2".encode("latin-1"), b"99999999999999999999", b"2147483648"]:
        headers = [(k.encode(), v.encode()) for k, v in tenant.headers.items()]
        response = client.get(url, headers=dict([*headers, (b"Last-Event-ID", value)]))
        error = _error(response, 400)
        assert error["param"] == "Last-Event-ID", value


# ---------------------------------------------------------------------------------------------- capacity


def test_jobs_over_the_fleet_capacity_are_refused_naming_the_largest(
    client: TestClient, tenant: TenantKey
) -> None:
    largest = client.app.state.services.settings.max_processes_per_job  # type: ignore[attr-defined]
    for processes in (largest + 1, 4096):
        body = {"spec": _spec_with("distributed.num_processes", processes)}
        for url in ("/v1/jobs/estimate", "/v1/jobs"):
            error = _error(client.post(url, json=body, headers=tenant.headers), 422)
            assert (error["code"], error["param"]) == ("exceeds_capacity", "spec.distributed.num_processes")
            assert f"has {largest} processes" in error["message"]
    body = {"spec": _spec_with("distributed.num_processes", largest)}
    assert client.post("/v1/jobs/estimate", json=body, headers=tenant.headers).status_code == 200


# ------------------------------------------------------------------------------------------- spec files


def test_spec_files_follow_the_same_rules(tmp_path: Any) -> None:
    from contract.spec import load_spec

    for text, where in [
        ('name: "a\\0b"\n', "name"),
        ("optim:\n  grad_clip: .inf\n", "optim.grad_clip"),
        ("seed: " + "1" * 70 + "\n", "seed"),
    ]:
        path = tmp_path / "spec.yaml"
        path.write_text(text)
        with pytest.raises(ValueError, match=where.replace(".", r"\.")):
            load_spec(path)


def test_safejson_limits_are_exact() -> None:
    ok = '{"a": ' * (safejson.MAX_DEPTH - 1) + "[]" + "}" * (safejson.MAX_DEPTH - 1)
    safejson.loads(ok)
    too_deep = '{"a": ' * safejson.MAX_DEPTH + "[]" + "}" * safejson.MAX_DEPTH
    with pytest.raises(safejson.UnsafeDocument):
        safejson.loads(too_deep)
    assert safejson.loads("9" * safejson.MAX_INT_DIGITS) == int("9" * safejson.MAX_INT_DIGITS)
    with pytest.raises(safejson.UnsafeDocument):
        safejson.loads("-" + "9" * (safejson.MAX_INT_DIGITS + 1))
    assert safejson.loads('["' + "[" * 48 + '"]') == ["[" * 48]  # brackets in strings do not nest


def test_unknown_query_parameters_are_refused_naming_them(client: TestClient, tenant: TenantKey) -> None:
    error = _error(client.get("/v1/jobs?limt=5", headers=tenant.headers), 422)
    assert (error["code"], error["param"]) == ("unknown_parameter", "limt")
    assert "limit" in error["message"]  # the ones it takes are listed
    job_id = create_job(client, tenant.headers)
    error = _error(client.get(f"/v1/jobs/{job_id}?verbose=1", headers=tenant.headers), 422)
    assert error["param"] == "verbose"
    assert client.get("/v1/jobs?limit=5", headers=tenant.headers).status_code == 200


def test_a_single_valued_query_parameter_given_twice_is_refused(
    client: TestClient, tenant: TenantKey
) -> None:
    for path in (
        "/v1/jobs?after=a&after=b",
        "/v1/files?limit=5&limit=6",
        "/v1/jobs?limit=5&status=queued&limit=5",
    ):
        error = _error(client.get(path, headers=tenant.headers), 422)
        assert error["code"] == "repeated_parameter", path
        assert error["param"] in ("after", "limit"), path
    assert client.get("/v1/jobs?limit=5&status=queued", headers=tenant.headers).status_code == 200
    from service.dependencies import _is_sequence

    # A list-typed parameter (none exists today) could repeat; scalar ones, optional or not, cannot.
    assert _is_sequence(list[str]) and _is_sequence(list[int] | None)
    assert not _is_sequence(int) and not _is_sequence(str | None)
