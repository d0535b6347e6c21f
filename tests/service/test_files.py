"""Dataset uploads: streamed with a size limit (413), checked line by line (422 with line numbers), and
nothing stored for a rejected upload."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from store.database import Database
from store.models import File
from tests.service.conftest import TenantKey
from tests.service.helpers import GOOD_JSONL, TINY_SPEC, upload
from tests.service.test_errors import assert_error


def stored_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def file_rows(db: Database, tenant: TenantKey) -> int:
    with db.sessions() as session:
        return int(
            session.scalar(sa.select(sa.func.count(File.id)).where(File.tenant_id == tenant.tenant_id)) or 0
        )


def test_a_valid_file_is_stored_listed_and_downloadable(client: TestClient, tenant: TenantKey) -> None:
    response = upload(
        client, tenant.headers, GOOD_JSONL, filename="../../evil name.jsonl", purpose="rl_train"
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["bytes"] == len(GOOD_JSONL) and body["records"] == 2 and body["status"] == "valid"
    assert body["sha256"] == hashlib.sha256(GOOD_JSONL).hexdigest()
    assert body["filename"] == "evil name.jsonl"
    assert client.get(f"/v1/files/{body['id']}", headers=tenant.headers).json() == body
    content = client.get(f"/v1/files/{body['id']}/content", headers=tenant.headers)
    assert content.status_code == 200 and content.content == GOOD_JSONL
    listed = client.get("/v1/files", headers=tenant.headers).json()
    assert [f["id"] for f in listed["data"]] == [body["id"]]


BAD_FILE = (
    b'{"prompt": "1+1=", "answer": "2"}\n'  # 1: fine
    b'{"prompt": "2+2=", "answer": 4\n'  # 2: not JSON
    b'{"prompt": "3+3="}\n'  # 3: missing answer
    b'{"prompt": "\xff\xfe", "answer": "x"}\n'  # 4: not UTF-8
    b"[1, 2, 3]\n"  # 5: not an object
    b"\n"  # 6: blank (allowed)
    b'{"prompt": "", "answer": "1"}\n'  # 7: empty prompt
)


def test_a_bad_file_is_a_422_with_line_numbers_and_nothing_is_stored(
    make_client: Callable[..., TestClient], tenant: TenantKey, db: Database, tmp_path: Path
) -> None:
    client = make_client(artifact_root=tmp_path / "art")
    error = assert_error(upload(client, tenant.headers, BAD_FILE), 422, "invalid_file", "file")
    lines = {(d["line"], d["code"]) for d in error["details"]}
    assert lines == {
        (2, "invalid_json"),
        (3, "missing_field"),
        (4, "not_utf8"),
        (5, "not_object"),
        (7, "empty_field"),
    }
    assert "line 2" in error["message"]
    assert next(d for d in error["details"] if d["line"] == 3)["param"] == "answer"
    assert file_rows(db, tenant) == 0
    assert stored_files(tmp_path / "art") == []


@pytest.mark.parametrize(
    ("content", "code", "line"),
    [
        (b"", "empty_file", 0),
        (b"\n\n  \n", "empty_file", 0),
        (
            b'{"prompt": "a", "answer": "b"}\n' + b'{"prompt": "' + b"x" * 3000 + b'", "answer": "y"}\n',
            "line_too_long",
            2,
        ),
    ],
)
def test_empty_files_and_overlong_lines_are_refused(
    make_client: Callable[..., TestClient],
    tenant: TenantKey,
    tmp_path: Path,
    content: bytes,
    code: str,
    line: int,
) -> None:
    client = make_client(artifact_root=tmp_path / "art", max_line_bytes=1024)
    error = assert_error(upload(client, tenant.headers, content), 422, "invalid_file")
    assert [(d["line"], d["code"]) for d in error["details"]] == [(line, code)]
    assert stored_files(tmp_path / "art") == []


def test_an_oversize_file_is_a_413_and_nothing_is_stored(
    make_client: Callable[..., TestClient], tenant: TenantKey, db: Database, tmp_path: Path
) -> None:
    client = make_client(artifact_root=tmp_path / "art", max_upload_bytes=1024)
    line = b'{"prompt": "1+1=", "answer": "2"}\n'
    # Declared size under limit + multipart overhead: cut off while streaming the file part.
    assert_error(upload(client, tenant.headers, line * 100), 413, "file_too_large", "file")
    # Declared size far over the limit: refused from Content-Length before reading the body.
    huge = line * 5000
    assert_error(upload(client, tenant.headers, huge), 413)
    assert file_rows(db, tenant) == 0
    assert stored_files(tmp_path / "art") == []
    # Exactly at the limit is fine.
    frame = b'{"prompt": "", "answer": "2"}\n'
    exact = frame.replace(b'""', b'"' + b"x" * (1024 - len(frame)) + b'"', 1)
    assert len(exact) == 1024
    assert upload(client, tenant.headers, exact).status_code == 201


def test_the_upload_is_streamed_and_cut_off_at_the_limit(
    make_client: Callable[..., TestClient], tenant: TenantKey, tmp_path: Path
) -> None:
    """Drive the ASGI app directly with a lazy body and no Content-Length: it stops reading at the limit."""
    client = make_client(artifact_root=tmp_path / "art", max_upload_bytes=256 * 1024)
    app = client.app
    chunk = b'{"prompt": "1+1=", "answer": "2"}\n' * 2000  # ~68 KB
    total_chunks = 200  # ~13.6 MB if it were all read
    head = b'--B\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += 1
        if pulled == 1:
            return {"type": "http.request", "body": head, "more_body": True}
        return {"type": "http.request", "body": chunk, "more_body": pulled < total_chunks}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/files",
        "raw_path": b"/v1/files",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"authorization", tenant.headers["Authorization"].encode()),
            (b"content-type", b"multipart/form-data; boundary=B"),
        ],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
        "state": {},
    }
    scope["app"] = app
    anyio.run(app, scope, receive, send)  # type: ignore[arg-type]
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert start["status"] == 413
    assert json.loads(body)["error"]["code"] == "file_too_large"
    assert pulled <= 6  # ~4 chunks reach 256 KB; nothing beyond the limit was read
    assert stored_files(tmp_path / "art") == []


@pytest.mark.parametrize(
    ("kwargs", "status", "param"),
    [
        ({"json": {"file": "data"}}, 415, "file"),
        ({"data": {"purpose": "rl_train"}, "files": {"other": ("a.txt", b"x")}}, 422, "other"),
        ({"files": {"file": ("a.jsonl", GOOD_JSONL)}, "data": {"purpose": "fine-tune"}}, 422, "purpose"),
        (
            {"content": b"--B\r\nbroken", "headers": {"Content-Type": "multipart/form-data; boundary=B"}},
            400,
            "file",
        ),
        ({"content": b"x", "headers": {"Content-Type": "multipart/form-data"}}, 400, "file"),
    ],
)
def test_malformed_uploads_are_4xx(
    client: TestClient, tenant: TenantKey, kwargs: dict[str, Any], status: int, param: str
) -> None:
    headers = {**tenant.headers, **kwargs.pop("headers", {})}
    assert_error(client.post("/v1/files", headers=headers, **kwargs), status, param=param)


def test_a_job_reads_an_uploaded_file_by_id_and_the_file_stays_while_the_job_runs(
    client: TestClient, tenant: TenantKey, artifact_root: Path
) -> None:
    file_id = upload(client, tenant.headers, GOOD_JSONL).json()["id"]
    spec = {**TINY_SPEC, "task": {"params": {}}}
    job = client.post(
        "/v1/jobs", json={"spec": spec, "training_file": file_id}, headers=tenant.headers
    ).json()
    task = job["spec"]["task"]
    assert job["training_file"] == file_id
    assert task["source"] == "jsonl"
    assert not task["path"].startswith("/") and (artifact_root / task["path"]).read_bytes() == GOOD_JSONL
    assert_error(client.delete(f"/v1/files/{file_id}", headers=tenant.headers), 409, "file_in_use")
    client.post(f"/v1/jobs/{job['id']}/cancel", headers=tenant.headers)
    deleted = client.delete(f"/v1/files/{file_id}", headers=tenant.headers)
    assert deleted.json() == {"id": file_id, "object": "file", "deleted": True}
    assert not (artifact_root / task["path"]).exists()
    assert_error(client.get(f"/v1/files/{file_id}", headers=tenant.headers), 404)
    assert client.get(f"/v1/jobs/{job['id']}", headers=tenant.headers).json()["training_file"] is None
