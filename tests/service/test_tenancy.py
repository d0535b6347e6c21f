"""Tenant isolation: every endpoint that takes an id answers another tenant's object with 404 (never 403,
never data), with the API key and with the job page's session cookie alike, and lists show only the
caller's objects. A new
endpoint with an id in its path is covered automatically (the list is read from the OpenAPI schema)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

from service.sessions import COOKIE_NAME, CSRF_HEADER
from store.database import Database
from tests.service.conftest import TenantKey
from tests.service.helpers import GOOD_JSONL, TINY_SPEC, FakeWorker, create_job, upload
from tests.service.test_errors import assert_error


def test_every_endpoint_hides_another_tenants_objects(
    client: TestClient, make_tenant: Callable[[], TenantKey], db: Database, artifact_root: Path
) -> None:
    owner, intruder = make_tenant(), make_tenant()
    file_id = upload(client, owner.headers, GOOD_JSONL).json()["id"]
    running_id = create_job(client, owner.headers)
    worker = FakeWorker(db, running_id)
    worker.steps(1, 5)
    checkpoint_id = worker.checkpoint(artifact_root, 5)
    ids = {
        "job_id": running_id,
        "file_id": file_id,
        "checkpoint_id": checkpoint_id,
        "key_id": owner.key_id,
    }
    paths = client.get("/openapi.json").json()["paths"]
    routes = [(method.upper(), path) for path, item in paths.items() if "{" in path for method in item]
    assert len(routes) == 16
    signed_in = client.post("/ui/session", json={"api_key": intruder.key}, headers={"X-Stare-Sign-In": "1"})
    cookie = signed_in.cookies[COOKIE_NAME]
    client.cookies.clear()
    signer = client.app.state.session_signer  # type: ignore[attr-defined]
    page_session = signer.verify(cookie)
    assert page_session is not None
    as_page = {"Cookie": f"{COOKIE_NAME}={cookie}", CSRF_HEADER: signer.csrf_token(page_session)}
    for method, template in routes:
        url = template.format(**ids)
        for query in ("", "?stream=true") if url.endswith("/events") else ("",):
            for credentials in (intruder.headers, as_page):  # the key, and the job page's session for it
                response = client.request(method, url + query, headers=credentials)
                assert_error(response, 404)

    # Nothing changed for the owner: the job still runs, the file and key still work.
    job = client.get(f"/v1/jobs/{running_id}", headers=owner.headers).json()
    assert job["status"] == "running"
    assert client.get(f"/v1/files/{file_id}/content", headers=owner.headers).content == GOOD_JSONL
    assert (
        client.get(f"/v1/jobs/{running_id}/checkpoints/{checkpoint_id}", headers=owner.headers).status_code
        == 200
    )
    assert client.get("/v1/me", headers=owner.headers).status_code == 200

    # Lists and usage show only the caller's objects; a job cannot read another tenant's file.
    assert client.get("/v1/jobs", headers=intruder.headers).json()["data"] == []
    assert client.get("/v1/files", headers=intruder.headers).json()["data"] == []
    keys = client.get("/v1/api-keys", headers=intruder.headers).json()["data"]
    assert [k["id"] for k in keys] == [intruder.key_id]
    assert client.get("/v1/me", headers=intruder.headers).json()["usage"]["jobs"] == 0
    body = {"spec": {**TINY_SPEC, "task": {"params": {}}}, "training_file": file_id}
    assert_error(
        client.post("/v1/jobs", json=body, headers=intruder.headers), 422, "unknown_file", "training_file"
    )
    page = client.get(
        "/v1/jobs", params={"after": "job_ZZZZZZZZZZZZZZZZZZZZZZZZZZ"}, headers=intruder.headers
    )
    assert page.json()["data"] == []
