"""Which checkpoints keep their training state on the server (issue 46, worker/retention.py): once the row of
a checkpoint is committed, every earlier checkpoint of the job drops `sharded/` and `rng/` and keeps
`model/` (and `state.json`, `model_config/`); a succeeded job's last checkpoint drops it too; a cancelled,
failed or paused job's latest checkpoint stays whole (it resumes from there); `checkpoint.training_state`
"latest" keeps a succeeded job's last one whole and "all" trims nothing. The rows of trimmed checkpoints
get their new sizes and lose their archive digests. On the real Recorder and PostgreSQL."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from contract.checkpointing import MODEL_DIRS, TRAINING_STATE, model_part
from store import repository
from store.artifacts import open_artifact_storage
from store.database import Database
from tests.service.conftest import (  # noqa: F401 - the service suite's fixtures, used here by name
    TenantKey,
    artifact_root,
    client,
    db,
    make_tenant,
    pg_url,
    postgres,
    settings,
    tenant,
)
from tests.service.helpers import create_job
from trainer.distributed.checkpoint import RNG_DIR, SHARDS_DIR
from worker.retention import trim_checkpoints
from worker.settings import WorkerSettings
from worker.training import Recorder

FILES = {
    "sharded/__0_0.distcp": 3000,
    "sharded/.metadata": 100,
    "rng/rank-00000.pt": 50,
    "model/model.safetensors": 1000,
    "model/config.json": 20,
    "model_config/config.json": 20,
    "state.json": 10,
}
MODEL_BYTES = sum(n for name, n in FILES.items() if not name.startswith(("sharded/", "rng/")))


def _checkpoint(run_dir: Path, step: int) -> Path:
    folder = run_dir / "checkpoints" / f"step-{step:06d}"
    for name, size in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"\1" * size)
    return folder


def _whole(folder: Path) -> bool:
    return (folder / "sharded").is_dir() and (folder / "rng").is_dir()


def _model_only(folder: Path) -> bool:
    left = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return left == sorted(n for n in FILES if not n.startswith(("sharded/", "rng/")))


def test_the_contract_names_the_trainers_folders() -> None:
    assert SHARDS_DIR in TRAINING_STATE and RNG_DIR in TRAINING_STATE and "model" in MODEL_DIRS
    assert model_part("model/config.json") and model_part("adapter/adapter_config.json")
    assert (
        not model_part("sharded/__0_0.distcp") and not model_part("state.json") and not model_part("modelx")
    )


def test_trim_drops_the_training_state_of_the_checkpoints_before_a_step(tmp_path: Path) -> None:
    folders = [_checkpoint(tmp_path, step) for step in (0, 5, 10)]
    (tmp_path / "checkpoints" / ".tmp-step-000015-1").mkdir()  # a checkpoint being written: not ours
    assert trim_checkpoints(tmp_path, 10) == {0: MODEL_BYTES, 5: MODEL_BYTES}
    assert _model_only(folders[0]) and _model_only(folders[1]) and _whole(folders[2])
    assert trim_checkpoints(tmp_path, 10) == {}  # nothing left to drop
    assert trim_checkpoints(tmp_path, None) == {10: MODEL_BYTES}
    assert all(_model_only(f) for f in folders)
    assert (tmp_path / "checkpoints" / ".tmp-step-000015-1").is_dir()
    assert trim_checkpoints(tmp_path / "none", None) == {}


def _recorder(
    database: Database, http: TestClient, owner: TenantKey, url: str, root: Path, kept: str | None
) -> Recorder:
    job_id = create_job(http, owner.headers)
    with database.transaction() as session:
        claim = repository.claim_job(session, job_id, owner="retention-test", lease_s=60)
    assert claim is not None
    if kept is not None:
        spec = dict(claim.resolved_spec)
        spec["checkpoint"] = {**spec["checkpoint"], "training_state": kept}
        claim = dataclasses.replace(claim, resolved_spec=spec)
    worker_settings = WorkerSettings(database_url=url, artifact_root=root, db_retry_max_s=5.0)
    return Recorder(database, claim, worker_settings, open_artifact_storage(root))


def _rows(db: Database, job_id: str) -> dict[int, tuple[int | None, str | None]]:  # noqa: F811
    with db.sessions() as session:
        return {c.step: (c.bytes, c.archive_sha256) for c in repository.list_checkpoints(session, job_id)}


@pytest.mark.parametrize(
    ("kept", "status", "last_whole"),
    [
        (None, "succeeded", False),  # the default, "resume"
        ("resume", "cancelled", True),
        ("resume", "failed", True),
        ("latest", "succeeded", True),
        ("all", "succeeded", True),
    ],
)
def test_the_recorder_trims_after_each_recorded_checkpoint_and_at_the_end(
    db: Database,  # noqa: F811
    client: TestClient,  # noqa: F811
    tenant: TenantKey,  # noqa: F811
    pg_url: str,  # noqa: F811
    artifact_root: Path,  # noqa: F811
    kept: str | None,
    status: str,
    last_whole: bool,
) -> None:
    recorder = _recorder(db, client, tenant, pg_url, artifact_root, kept)
    job_id, run_dir = recorder.claim.job_id, recorder.storage.local_path(recorder.claim.run_dir)
    first = _checkpoint(run_dir, 0)
    recorder.record_batch([{"type": "checkpoint", "step": 0, "path": str(first)}])
    assert _whole(first)  # the only checkpoint: a resume starts there
    second = _checkpoint(run_dir, 4)
    whole_bytes = sum(FILES.values())
    assert _rows(db, job_id) == {0: (whole_bytes, None)}
    with db.transaction() as session:  # a download computed the whole folder's digest
        row = repository.list_checkpoints(session, job_id)[0]
        repository.set_checkpoint_archive(session, row, "ab" * 32, 12345)
    recorder.record_batch([{"type": "checkpoint", "step": 4, "path": str(second)}])
    if kept == "all":
        assert _whole(first) and _whole(second)
        assert _rows(db, job_id) == {0: (whole_bytes, "ab" * 32), 4: (whole_bytes, None)}
    else:
        assert _model_only(first) and _whole(second)  # recorded: the earlier one is not resumed from
        assert _rows(db, job_id) == {0: (MODEL_BYTES, None), 4: (whole_bytes, None)}
    error = repository.JobError("storage_full", "disk full", "system") if status == "failed" else None
    recorder.finish(status, error)
    assert _whole(second) == last_whole
    assert _rows(db, job_id)[4] == (whole_bytes if last_whole else MODEL_BYTES, None)
