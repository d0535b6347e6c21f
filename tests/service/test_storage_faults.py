"""Uploads while the artifact storage fails, on a real filesystem: a small tmpfs that fills up (ENOSPC) or is
remounted read-only (EROFS). The answer is 507 or 503 with Retry-After, never a 500, and nothing is stored:
no file row, no stored object, no staged leftovers. Needs root (mount); skipped otherwise, saying why."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import TenantKey
from tests.service.helpers import GOOD_JSONL, upload


def _mount(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted at teardown."""
    point = tmp_path / "artifacts"
    point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = _mount(["-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)])
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30)


def _stored(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != "filler")


def _big_jsonl(size: int) -> bytes:
    line = b'{"prompt": "1+1=", "answer": "2"}\n'
    return line * (size // len(line) + 1)


def test_upload_to_full_storage_is_507_and_stores_nothing(
    small_tmpfs: Path, make_client: Callable[..., TestClient], make_tenant: Callable[[], TenantKey]
) -> None:
    client = make_client(artifact_root=small_tmpfs)
    tenant = make_tenant()
    (small_tmpfs / "filler").write_bytes(b"\0" * (1024 * 1024 - 64 * 1024))  # leave ~64 KiB
    response = upload(client, tenant.headers, _big_jsonl(300 * 1024))
    assert response.status_code == 507, response.text
    assert response.json()["error"]["code"] == "storage_full"
    assert "ENOSPC" in response.json()["error"]["message"]
    assert int(response.headers["Retry-After"]) > 0
    assert client.get("/v1/files", headers=tenant.headers).json()["data"] == []
    assert _stored(small_tmpfs) == []  # the partial staged file is gone too
    (small_tmpfs / "filler").unlink()  # space is back: the same upload now succeeds
    assert upload(client, tenant.headers, _big_jsonl(300 * 1024)).status_code == 201


def test_upload_to_read_only_storage_is_503_and_stores_nothing(
    small_tmpfs: Path, make_client: Callable[..., TestClient], make_tenant: Callable[[], TenantKey]
) -> None:
    client = make_client(artifact_root=small_tmpfs)
    tenant = make_tenant()
    assert upload(client, tenant.headers, GOOD_JSONL).status_code == 201  # writable: works
    before = _stored(small_tmpfs)
    assert _mount(["-o", "remount,ro", str(small_tmpfs)]).returncode == 0
    try:
        response = upload(client, tenant.headers, GOOD_JSONL)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "storage_read_only"
        assert int(response.headers["Retry-After"]) > 0
        assert len(client.get("/v1/files", headers=tenant.headers).json()["data"]) == 1
        assert _stored(small_tmpfs) == before
        # Reading what is stored still works while the storage is read-only.
        file_id = client.get("/v1/files", headers=tenant.headers).json()["data"][0]["id"]
        download = client.get(f"/v1/files/{file_id}/content", headers=tenant.headers)
        assert download.status_code == 200 and download.content == GOOD_JSONL
    finally:
        _mount(["-o", "remount,rw", str(small_tmpfs)])
    assert upload(client, tenant.headers, GOOD_JSONL).status_code == 201
