"""Uploads while the artifact storage fails, on a real filesystem: a small tmpfs that fills up (ENOSPC) or is
remounted read-only (EROFS). The answer is 507 or 503 with Retry-After, never a 500, and nothing is stored:
no file row, no stored object, no staged leftovers. And a tenant's folder that is a filesystem of its own
(a mount under the artifact root) takes uploads like any other folder: a file is staged beside its
destination, so committing it is a rename on one filesystem (never EXDEV).

Needs root (mount, tests/worker/mounts.py); skipped otherwise as a missing real component."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import TenantKey
from tests.service.helpers import GOOD_JSONL, upload
from tests.worker.mounts import Tmpfs


def _mount(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted at teardown."""
    disk = Tmpfs(tmp_path / "artifacts", size_mib=1)
    try:
        yield disk.path
    finally:
        disk.unmount()


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


def test_upload_to_a_tenant_folder_on_its_own_filesystem_is_stored(
    tmp_path: Path, make_client: Callable[..., TestClient], make_tenant: Callable[[], TenantKey]
) -> None:
    """Issue 21: the staging folder sat at the artifact root, so with the tenant's folder on a mount of its
    own every upload's rename crossed filesystems (EXDEV) and was answered 503 "retry later" for ever."""
    root = tmp_path / "artifacts"
    client = make_client(artifact_root=root)
    tenant = make_tenant()
    disk = Tmpfs(root / tenant.tenant_id, size_mib=4)
    try:
        assert (root / tenant.tenant_id).stat().st_dev != root.stat().st_dev  # really another filesystem
        response = upload(client, tenant.headers, GOOD_JSONL)
        assert response.status_code == 201, response.text
        file_id = response.json()["id"]
        download = client.get(f"/v1/files/{file_id}/content", headers=tenant.headers)
        assert download.status_code == 200 and download.content == GOOD_JSONL
        stored = sorted(p.relative_to(disk.path).as_posix() for p in disk.path.rglob("*") if p.is_file())
        assert stored == [f"files/{file_id}.jsonl"]  # on the tenant's filesystem, no staged leftover
        assert sorted(p.name for p in root.rglob("*") if p.is_file()) == [f"{file_id}.jsonl"]
    finally:
        disk.unmount()


def test_a_staged_file_on_another_filesystem_is_copied_and_renamed_into_place(tmp_path: Path) -> None:
    """commit()'s fallback: a staged file that is not on its destination's filesystem is copied beside the
    destination, fsynced and renamed (never left half-written, never a 503)."""
    from store.artifacts import STAGED_PREFIX, LocalArtifactStorage

    disk = Tmpfs(tmp_path / "artifacts", size_mib=1)
    try:
        storage = LocalArtifactStorage(disk.path)
        elsewhere = tmp_path / "staged.partial"  # on the test's own filesystem, not the tmpfs
        elsewhere.write_bytes(GOOD_JSONL)
        assert elsewhere.stat().st_dev != disk.path.stat().st_dev
        storage.commit(elsewhere, "ten_a/files/file_b.jsonl")
        assert (disk.path / "ten_a/files/file_b.jsonl").read_bytes() == GOOD_JSONL
        assert not elsewhere.exists()
        assert [p.name for p in (disk.path / "ten_a/files").iterdir()] == ["file_b.jsonl"]
        assert not any(p.name.startswith(STAGED_PREFIX) for p in disk.path.rglob("*"))
    finally:
        disk.unmount()
