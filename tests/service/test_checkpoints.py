"""Checkpoints: listed with their step's metrics, downloaded as a streamed tar whose SHA-256 is sent up
front, addressed by id only, and unable to reach outside the job's folder or the artifact root."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from store import repository
from store.database import Database
from store.models import Checkpoint
from tests.service.conftest import TenantKey
from tests.service.helpers import FakeWorker, create_job
from tests.service.test_errors import assert_error

FILES = {
    "model/model.safetensors": os.urandom(3000),
    "model/config.json": b'{"hidden": 128}',
    "state.json": b'{"step": 5}',
    "trainer_state.pt": b"\x80\x04" * 100,
}


@pytest.fixture
def finished_job(
    client: TestClient, tenant: TenantKey, db: Database, artifact_root: Path
) -> tuple[str, str, FakeWorker]:
    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    worker.steps(1, 5)
    checkpoint_id = worker.checkpoint(artifact_root, 5, FILES)
    return job_id, checkpoint_id, worker


def test_list_and_get_carry_the_step_metrics(
    client: TestClient, tenant: TenantKey, finished_job: tuple[str, str, FakeWorker]
) -> None:
    job_id, checkpoint_id, _ = finished_job
    listed = client.get(f"/v1/jobs/{job_id}/checkpoints", headers=tenant.headers).json()["data"]
    assert [c["id"] for c in listed] == [checkpoint_id]
    one = client.get(f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}", headers=tenant.headers).json()
    assert one["step"] == 5 and one["metrics"]["entropy/mean"] == 0.5
    assert one["download_url"] == f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/download"
    assert "path" not in one  # addressed by id; the storage path never leaves the server


def test_download_is_a_tar_of_the_folder_with_its_sha256(
    client: TestClient, tenant: TenantKey, finished_job: tuple[str, str, FakeWorker]
) -> None:
    job_id, checkpoint_id, _ = finished_job
    url = f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/download"
    response = client.get(url, headers=tenant.headers)
    assert response.status_code == 200
    body = response.content
    assert response.headers["X-Content-SHA256"] == hashlib.sha256(body).hexdigest()
    assert int(response.headers["Content-Length"]) == len(body)
    top = f"{job_id}-step-000005"
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert members == {f"{top}/{name}": data for name, data in FILES.items()}
    again = client.get(url, headers=tenant.headers)  # deterministic: same bytes, digest served from the row
    assert again.content == body and again.headers["X-Content-SHA256"] == response.headers["X-Content-SHA256"]
    assert client.get(f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}", headers=tenant.headers).json()[
        "sha256"
    ] == (hashlib.sha256(body).hexdigest())


def test_the_worker_cannot_record_a_path_outside_the_root(
    db: Database, finished_job: tuple[str, str, FakeWorker]
) -> None:
    job_id, _, worker = finished_job
    for bad in ("../../etc", "/etc", "a/../../b", "", "a\\..\\b"):
        with db.transaction() as session, pytest.raises(ValueError):
            repository.add_checkpoint(session, job_id, worker.token, 10, bad)


@pytest.mark.parametrize(
    "path",
    [
        "../../../../etc",
        "{tenant}/{job}/../../../..",
        "{tenant}/job_OTHER/run/checkpoints/step-000005",
        "/etc",
    ],
)
def test_a_tampered_row_cannot_reach_outside_the_jobs_folder(
    client: TestClient, tenant: TenantKey, db: Database, finished_job: tuple[str, str, FakeWorker], path: str
) -> None:
    job_id, checkpoint_id, _ = finished_job
    with db.transaction() as session:  # simulate a corrupted or malicious row
        session.execute(
            sa.update(Checkpoint)
            .where(Checkpoint.id == checkpoint_id)
            .values(path=path.format(tenant=tenant.tenant_id, job=job_id), archive_sha256=None)
        )
    response = client.get(f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/download", headers=tenant.headers)
    assert_error(response, 404)


def test_symlinks_inside_a_checkpoint_are_never_followed(
    client: TestClient,
    tenant: TenantKey,
    artifact_root: Path,
    finished_job: tuple[str, str, FakeWorker],
    tmp_path: Path,
) -> None:
    job_id, checkpoint_id, worker = finished_job
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"outside the artifact root")
    folder = artifact_root / worker.claim.run_dir / "checkpoints" / "step-000005"
    (folder / "leak.txt").symlink_to(secret)
    (folder / "leakdir").symlink_to(tmp_path, target_is_directory=True)
    response = client.get(f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/download", headers=tenant.headers)
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        names = tar.getnames()
        payload = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())  # type: ignore[union-attr]
    assert not any("leak" in name for name in names)
    assert b"outside the artifact root" not in payload


def test_an_unknown_checkpoint_id_is_404(
    client: TestClient, tenant: TenantKey, finished_job: tuple[str, str, FakeWorker]
) -> None:
    job_id, _, _ = finished_job
    for suffix in ("", "/download"):
        assert_error(
            client.get(f"/v1/jobs/{job_id}/checkpoints/ckpt_nope{suffix}", headers=tenant.headers), 404
        )


def test_a_checkpoint_folder_that_is_a_symlink_out_of_the_root_is_refused(
    client: TestClient,
    tenant: TenantKey,
    artifact_root: Path,
    finished_job: tuple[str, str, FakeWorker],
    tmp_path: Path,
) -> None:
    job_id, checkpoint_id, worker = finished_job
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"outside the artifact root")
    folder = artifact_root / worker.claim.run_dir / "checkpoints" / "step-000005"
    for child in sorted(folder.rglob("*"), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    folder.rmdir()
    folder.symlink_to(outside, target_is_directory=True)
    response = client.get(f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/download", headers=tenant.headers)
    assert_error(response, 404)


def test_a_digest_precomputed_by_the_worker_matches_the_download(
    client: TestClient, tenant: TenantKey, db: Database, artifact_root: Path
) -> None:
    from service.storage import archive_digest, checkpoint_archive_name
    from store.artifacts import LocalArtifactStorage

    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    worker.checkpoint(artifact_root, 10, FILES)  # writes the folder (and a row without a digest)
    relative = f"{worker.claim.run_dir}/checkpoints/step-000010"
    storage = LocalArtifactStorage(artifact_root)
    sha256, size = archive_digest(storage, storage.walk(relative), checkpoint_archive_name(job_id, 10))
    with db.transaction() as session:  # the worker re-records the step with its digest
        checkpoint_id = repository.add_checkpoint(
            session, job_id, worker.token, 10, relative, archive_sha256=sha256, archive_bytes=size
        )
    response = client.get(f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/download", headers=tenant.headers)
    assert response.headers["X-Content-SHA256"] == sha256 == hashlib.sha256(response.content).hexdigest()
    assert len(response.content) == size


def test_a_model_only_download_holds_model_and_adapter_alone_and_the_job_says_its_disk(
    client: TestClient, tenant: TenantKey, db: Database, artifact_root: Path
) -> None:
    """Issue 46: `?model_only=true` streams model/ (and adapter/) without the training state; its digest is
    its own (the row keeps the whole folder's), and a checkpoint without either is 404."""
    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    files = {
        **FILES,
        "adapter/adapter_config.json": b"{}",
        "sharded/__0_0.distcp": os.urandom(5000),
        "rng/rank-00000.pt": b"rng",
    }
    checkpoint_id = worker.checkpoint(artifact_root, 5, files)
    url = f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/download"
    whole = client.get(url, headers=tenant.headers)
    response = client.get(url, params={"model_only": "true"}, headers=tenant.headers)
    assert response.status_code == 200, response.text
    body = response.content
    assert response.headers["X-Content-SHA256"] == hashlib.sha256(body).hexdigest()
    assert int(response.headers["Content-Length"]) == len(body) < len(whole.content)
    top = f"{job_id}-step-000005"
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    wanted = ("model/model.safetensors", "model/config.json", "adapter/adapter_config.json")
    assert members == {f"{top}/{name}": files[name] for name in wanted}
    listed = client.get(f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}", headers=tenant.headers).json()
    assert listed["sha256"] == whole.headers["X-Content-SHA256"]  # the row keeps the whole folder's digest

    bare = worker.checkpoint(artifact_root, 6, {"state.json": b"{}"})
    missing = client.get(
        f"/v1/jobs/{job_id}/checkpoints/{bare}/download",
        params={"model_only": "true"},
        headers=tenant.headers,
    )
    assert_error(missing, 404, "not_found", param="model_only")
    # The job view says what the job's files take on the server (the one job's GET; not in lists).
    job = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()
    assert job["disk_bytes"] == sum(len(data) for data in files.values()) + len(b"{}")
    listed_jobs = client.get("/v1/jobs", headers=tenant.headers).json()["data"]
    assert next(j for j in listed_jobs if j["id"] == job_id)["disk_bytes"] is None
    fresh = create_job(client, tenant.headers)  # no worker made its folder yet
    assert client.get(f"/v1/jobs/{fresh}", headers=tenant.headers).json()["disk_bytes"] == 0
