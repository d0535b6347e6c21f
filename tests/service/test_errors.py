"""Bad input: every rejection is a 4xx in the one error shape naming the offending field, never a 500, and a
rejected request writes nothing."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from store.database import Database
from store.models import Job
from tests.service.conftest import TenantKey
from tests.service.helpers import TINY_SPEC


def assert_error(
    response: Any, status: int, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert {"code", "message", "param"} <= set(error)
    assert isinstance(error["message"], str) and error["message"]
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    return error


def with_spec(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(TINY_SPEC)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = spec
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return spec


BAD_SPECS = [
    pytest.param(with_spec(optim__lr=5.0), "spec.optim.lr", "invalid_spec", id="lr-out-of-range"),
    pytest.param(with_spec(optim__steps=0), "spec.optim.steps", "invalid_spec", id="zero-steps"),
    pytest.param(
        with_spec(sampling__group_size="eight"), "spec.sampling.group_size", "invalid_spec", id="wrong-type"
    ),
    pytest.param(with_spec(optim__bogus=1), "spec.optim.bogus", "invalid_spec", id="unknown-field"),
    pytest.param(
        with_spec(algorithm__name="ppo9000"), "spec.algorithm.name", "invalid_spec", id="unknown-algorithm"
    ),
    pytest.param(with_spec(model__name="/etc/passwd"), "spec.model.name", "unknown_model", id="model-path"),
    pytest.param(with_spec(model__name="gpt-17"), "spec.model.name", "unknown_model", id="unknown-model"),
    pytest.param(
        with_spec(verifier__name="exec_python"),
        "spec.verifier.name",
        "unknown_verifier",
        id="unknown-verifier",
    ),
    pytest.param(
        with_spec(verifier__name="exact", verifier__params={"nope": 1}),
        "spec.verifier.params.nope",
        "invalid_spec",
        id="verifier-params",
    ),
    pytest.param(
        with_spec(task__source="reasoning_gym", task__name="no_such_task", task__params={}),
        "spec.task.name",
        "unknown_task",
        id="unknown-task",
    ),
    pytest.param(
        with_spec(task__params={"operations": ["^"]}), "spec.task.params", "invalid_spec", id="task-params"
    ),
    pytest.param(with_spec(task__path="/etc/passwd"), "spec.task.path", "invalid_spec", id="user-task-path"),
    pytest.param(
        with_spec(task__source="jsonl", task__params={}),
        "training_file",
        "invalid_spec",
        id="jsonl-without-file",
    ),
    pytest.param(
        with_spec(entropy_band={"low": 2.0, "high": 1.0}),
        "spec.entropy_band.low",
        "invalid_spec",
        id="band-order",
    ),
    pytest.param(
        with_spec(algorithm={"name": "clip_pi"}),
        "spec.optim.ppo_epochs",
        "invalid_spec",
        id="clip-pi-on-policy",
    ),
    pytest.param(
        with_spec(task__prompt_template="{prompt} {other}"),
        "spec.task.prompt_template",
        "invalid_spec",
        id="template-field",
    ),
]


@pytest.mark.parametrize(("spec", "param", "code"), BAD_SPECS)
def test_a_bad_spec_is_a_422_naming_the_field_and_creates_nothing(
    client: TestClient, tenant: TenantKey, db: Database, spec: dict[str, Any], param: str, code: str
) -> None:
    for path in ("/v1/jobs/estimate", "/v1/jobs"):
        assert_error(client.post(path, json={"spec": spec}, headers=tenant.headers), 422, code, param)
    with db.sessions() as session:
        assert session.scalar(sa.select(sa.func.count(Job.id)).where(Job.tenant_id == tenant.tenant_id)) == 0


def test_malformed_json_is_a_422_in_the_error_shape(client: TestClient, tenant: TenantKey) -> None:
    headers = {**tenant.headers, "Content-Type": "application/json"}
    assert_error(client.post("/v1/jobs", content=b'{"spec": ', headers=headers), 422, "invalid_json")
    assert_error(client.post("/v1/jobs", content=b"\xff\xfe", headers=headers), 422)
    assert_error(client.post("/v1/jobs", content=b"[1, 2]", headers=headers), 422)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"spec": TINY_SPEC, "colour": "red"}, "colour"),
        ({"spec": "not an object"}, "spec"),
        ({"spec": TINY_SPEC, "training_file": "../../etc/passwd"}, "training_file"),
        ({"spec": TINY_SPEC, "metadata": {"k": 5}}, "metadata.k"),
        ({"spec": TINY_SPEC, "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ],
)
def test_request_body_errors_name_the_field(
    client: TestClient, tenant: TenantKey, body: dict[str, Any], param: str
) -> None:
    assert_error(client.post("/v1/jobs", json=body, headers=tenant.headers), 422, param=param)


@pytest.mark.parametrize(
    ("url", "param"),
    [
        ("/v1/jobs?limit=0", "limit"),
        ("/v1/jobs?limit=abc", "limit"),
        ("/v1/jobs?status=sleeping", "status"),
        ("/v1/files?purpose=other", "purpose"),
    ],
)
def test_query_errors_name_the_parameter(client: TestClient, tenant: TenantKey, url: str, param: str) -> None:
    assert_error(client.get(url, headers=tenant.headers), 422, param=param)


def test_an_unknown_file_id_is_a_422_on_training_file(client: TestClient, tenant: TenantKey) -> None:
    body = {"spec": TINY_SPEC, "training_file": "file_01M8MQXZJAET9BKZDRWGP09PBP"}
    assert_error(
        client.post("/v1/jobs", json=body, headers=tenant.headers), 422, "unknown_file", "training_file"
    )


def test_http_level_errors_use_the_shape(client: TestClient, tenant: TenantKey) -> None:
    assert_error(client.get("/v1/no-such-thing", headers=tenant.headers), 404, "not_found")
    assert_error(client.put("/v1/jobs", headers=tenant.headers), 405, "method_not_allowed")
    assert_error(client.get("/v1/jobs/job_x", headers=tenant.headers), 404, "not_found", "job_id")


def test_an_oversize_json_body_is_a_413(make_client: Any, tenant: TenantKey) -> None:
    small = make_client(max_json_body_bytes=2048)
    big = {"spec": {**TINY_SPEC, "name": "x" * 150}, "metadata": {f"k{i}": "v" * 500 for i in range(8)}}
    assert_error(small.post("/v1/jobs", json=big, headers=tenant.headers), 413, "payload_too_large")

    def chunks() -> Any:  # no Content-Length: the limit is enforced while reading
        yield b'{"spec": {}, "metadata": {"k": "'
        for _ in range(10):
            yield b"v" * 512
        yield b'"}}'

    headers = {**tenant.headers, "Content-Type": "application/json"}
    assert_error(small.post("/v1/jobs", content=chunks(), headers=headers), 413, "payload_too_large")


def test_an_unexpected_failure_is_a_500_in_the_shape_without_details(
    client: TestClient, tenant: TenantKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    from store import repository

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(repository, "list_jobs", broken)
    error = assert_error(client.get("/v1/jobs", headers=tenant.headers), 500, "internal_error")
    assert "secret" not in error["message"]


def test_a_database_outage_is_a_503_with_retry_after(make_client: Any, tenant: TenantKey) -> None:
    down = make_client(database_url="postgresql+psycopg://nobody@127.0.0.1:1/none")
    for url in ("/v1/jobs", "/v1/jobs/job_01M8MQXZTFZKWWG1130Q9S1XBX"):
        response = down.get(url, headers=tenant.headers)
        assert_error(response, 503, "database_unavailable")
        assert response.headers["Retry-After"] == "5"


def test_the_async_read_path_also_answers_503_when_the_database_is_gone(
    make_client: Any, tenant: TenantKey
) -> None:
    from tests.service.helpers import create_job

    client = make_client()
    job_id = create_job(client, tenant.headers)
    assert client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).status_code == 200  # key now cached
    pool = client.app.state.services.db.async_pool  # type: ignore[attr-defined]
    assert pool is not None
    pool._discard_all()
    pool.conninfo = "postgresql://nobody@127.0.0.1:1/none"  # the database host goes away
    assert_error(client.get(f"/v1/jobs/{job_id}", headers=tenant.headers), 503, "database_unavailable")
