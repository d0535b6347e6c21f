"""The worker's Recorder on real PostgreSQL: a batch written twice (what `with_db_retry` does when a COMMIT
succeeded but its reply was lost) leaves the rows of one write, and a lost lease stops every write."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from store import repository
from store.artifacts import open_artifact_storage
from store.database import Database
from store.models import Checkpoint, JobEvent, JobMetric
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
from tests.service.helpers import create_job, step_metrics
from worker.settings import WorkerSettings
from worker.training import LeaseLost, Recorder


@pytest.fixture
def recorder(
    db: Database,  # noqa: F811
    client: TestClient,  # noqa: F811
    tenant: TenantKey,  # noqa: F811
    artifact_root: Path,  # noqa: F811
    pg_url: str,  # noqa: F811
) -> Recorder:
    job_id = create_job(client, tenant.headers)
    with db.transaction() as session:
        claim = repository.claim_job(session, job_id, owner="recorder-test", lease_s=60)
    assert claim is not None
    worker_settings = WorkerSettings(database_url=pg_url, artifact_root=artifact_root, db_retry_max_s=5.0)
    return Recorder(db, claim, worker_settings, open_artifact_storage(worker_settings.artifact_root))


def _count(db: Database, model: type, job_id: str, **where: object) -> int:  # noqa: F811 - db: the fixture's name
    with db.sessions() as session:
        query = sa.select(sa.func.count()).select_from(model).where(model.job_id == job_id)
        for column, value in where.items():
            query = query.where(getattr(model, column) == value)
        return int(session.execute(query).scalar_one())


def test_a_batch_written_twice_leaves_the_rows_of_one_write(
    recorder: Recorder,
    db: Database,  # noqa: F811
    artifact_root: Path,  # noqa: F811
) -> None:
    job_id = recorder.claim.job_id
    folder = artifact_root / "recorder" / job_id / "checkpoints" / "step-000002"
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_bytes(b"\0" * 1000)
    batch = [
        {"type": "sft", "step": 100, "total": 200, "loss": 0.5},
        {"type": "step", "step": 1, "metrics": step_metrics(1, 0.4)},
        {"type": "step", "step": 2, "metrics": step_metrics(2, 0.5)},
        {"type": "checkpoint", "step": 2, "path": str(folder)},
        {"type": "resumed", "step": 2},
    ]
    recorder.record_batch(batch)
    recorder.record_batch(batch)  # the retry of a batch whose COMMIT reply was lost
    assert _count(db, JobMetric, job_id) == 2
    assert _count(db, Checkpoint, job_id) == 1
    for kind in ("checkpoint.created", "sft.progress", "trainer.resumed"):
        assert _count(db, JobEvent, job_id, type=kind) == 1, kind
    with db.sessions() as session:
        latest = repository.latest_checkpoint(session, job_id)
    assert latest is not None and latest.step == 2 and latest.bytes == 1000
    assert latest.path == f"recorder/{job_id}/checkpoints/step-000002"

    # A later attempt writes its own events again (the dedupe key carries the attempt), not the same rows.
    with db.transaction() as session:
        assert repository.retry_job(
            session, job_id, recorder.claim.lease_token, repository.JobError("lost", "worker lost", "system")
        )
        claim = repository.claim_job(session, job_id, owner="recorder-test-2", lease_s=60)
    assert claim is not None and claim.attempt == 2
    second = Recorder(db, claim, recorder.settings, recorder.storage)
    second.record_batch([{"type": "resumed", "step": 2}])
    assert _count(db, JobEvent, job_id, type="trainer.resumed") == 2

    # The first attempt's lease is gone: its writes are refused, and nothing is written.
    with pytest.raises(LeaseLost):
        recorder.record_batch([{"type": "step", "step": 3, "metrics": step_metrics(3, 0.6)}])
    assert _count(db, JobMetric, job_id) == 2


def test_what_the_tenant_sees_names_paths_relative_to_its_folder(
    recorder: Recorder,
    db: Database,  # noqa: F811
    artifact_root: Path,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 21: a storage fault showed the tenant the server's absolute artifact path, in the trainer.error
    event and in the job's error. The tenant's copy is relative to its folder; the worker's log keeps the
    absolute path."""
    claim = recorder.claim
    absolute = f"{artifact_root.resolve()}/{claim.tenant_id}/{claim.job_id}/run/checkpoints/.tmp-step-000004"
    message = f"cannot write {absolute}: ENOSPC (No space left on device)"
    shown = f"cannot write {claim.job_id}/run/checkpoints/.tmp-step-000004: ENOSPC (No space left on device)"
    with caplog.at_level(logging.ERROR, logger="worker.training"):
        recorder.record(
            {"type": "error", "step": 4, "code": "storage_full", "path": absolute, "message": message}
        )
    recorder.finish("failed", repository.JobError("storage_full", message, "system"))
    with db.sessions() as session:
        job = repository.load_job(session, claim.job_id)
        events, _ = repository.list_events(session, claim.job_id, after=0, limit=100)
    assert job is not None and job.error_message == shown
    assert [e.message for e in events if e.type == "trainer.error"] == [shown]
    assert all(str(artifact_root.resolve()) not in e.message for e in events)
    assert absolute in caplog.text


def test_a_checkpoint_pruned_before_it_was_recorded_is_recorded_then_removed(
    recorder: Recorder,
    db: Database,  # noqa: F811
    artifact_root: Path,  # noqa: F811
) -> None:
    """After a database outage the worker records events late: the trainer may have pruned a checkpoint
    (keep_last) by then. Its row is written and removed by the pruning event, and the worker goes on."""
    job_id = recorder.claim.job_id
    gone = artifact_root / recorder.claim.run_dir / "checkpoints" / "step-000006"  # never on disk now
    recorder.record_batch(
        [{"type": "checkpoint", "step": 6, "path": str(gone)}, {"type": "checkpoint_deleted", "step": 6}]
    )
    assert _count(db, Checkpoint, job_id) == 0
    assert _count(db, JobEvent, job_id, type="checkpoint.created") == 1


def test_samples_warnings_steps_and_evaluations_become_events_the_job_view_shows(
    recorder: Recorder,
    db: Database,  # noqa: F811
    client: TestClient,  # noqa: F811
    tenant: TenantKey,  # noqa: F811
) -> None:
    job_id = recorder.claim.job_id
    cut = {"type": "warning", "kind": "truncated_responses", "message": "raise sampling.max_new_tokens"}
    sample = {"prompt": "1+2=", "completion": "<b>3</b>", "reference": "3", "reward": 1.0, "truncated": False}
    batch = [
        {"type": "eval", "step": 0, "metrics": {"eval/avg@k": 0.25, "eval/k": 1.0}},
        {"type": "samples", "step": 0, "phase": "eval", "samples": [sample, "junk"]},
        {"type": "step", "step": 1, "metrics": step_metrics(1, 0.4)},
        {"type": "samples", "step": 1, "phase": "train", "samples": [sample]},
        {**cut, "step": 3, "count": 1, "first_step": 3},
        {**cut, "step": 13, "count": 11, "first_step": 3},
        {
            "type": "warning",
            "step": 1,
            "kind": "entropy_far_from_band",
            "message": "set entropy_band",
            "count": 1,
            "first_step": 1,
        },
        {"type": "warning", "step": 1, "kind": "not_a_kind", "message": "x", "count": 1, "first_step": 1},
        {"type": "samples", "step": 2, "phase": "eval", "samples": [{**sample, "completion": "4"}]},
    ]
    recorder.record_batch(batch)
    recorder.record_batch(batch)  # a retried write adds nothing
    counts = {
        kind: _count(db, JobEvent, job_id, type=kind)
        for kind in (
            "eval.completed",
            "step.completed",
            "samples.eval",
            "samples.train",
            "warning.truncated_responses",
        )
    }
    assert counts == {
        "eval.completed": 1,
        "step.completed": 1,
        "samples.eval": 2,
        "samples.train": 1,
        "warning.truncated_responses": 2,
    }
    assert _count(db, JobEvent, job_id, type="warning.not_a_kind") == 0
    with db.sessions() as session:
        [step_event] = [
            e
            for e in session.scalars(
                sa.select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.type == "step.completed")
            )
        ]
    assert step_event.step == 1 and step_event.data["metrics"]["entropy/mean"] == 0.4

    job = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()
    warned = {w["kind"]: w for w in job["warnings"]}
    assert warned["truncated_responses"] == {
        "kind": "truncated_responses",
        "message": "raise sampling.max_new_tokens",
        "step": 13,
        "count": 11,
        "first_step": 3,
    }
    assert set(warned) == {"truncated_responses", "entropy_far_from_band"}
    # the latest of each phase; the junk sample dropped; the text as written (the page escapes it)
    assert job["samples"]["eval"] == {"step": 2, "samples": [{**sample, "completion": "4"}]}
    assert job["samples"]["train"] == {"step": 1, "samples": [sample]}
    report = client.get(f"/v1/jobs/{job_id}/report", headers=tenant.headers).json()
    assert report["samples"]["eval_first"] == {"step": 0, "samples": [sample]}
    assert [w["step"] for w in report["warnings"] if w["kind"] == "truncated_responses"] == [13]
    page = client.get(f"/v1/jobs/{job_id}/report?format=html", headers=tenant.headers).text
    assert "&lt;b&gt;3&lt;/b&gt;" in page and "<b>3</b>" not in page
