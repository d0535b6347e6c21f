"""The repository functions the worker (issue 5) writes through: one conditional UPDATE claims a job, and
every later write is fenced by the lease token, so a worker that lost its lease writes nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from store import repository
from store.database import Database
from store.models import DEFAULT_MAX_LOST_WORKERS, Checkpoint, JobEvent, JobMetric
from tests.service.conftest import TenantKey
from tests.service.helpers import create_job, step_metrics


@pytest.fixture
def job_id(client: TestClient, tenant: TenantKey) -> str:
    return create_job(client, tenant.headers)


def claim(db: Database, job_id: str, owner: str = "w1") -> repository.Claim | None:
    with db.transaction() as session:
        return repository.claim_job(session, job_id, owner=owner, lease_s=30)


def count(db: Database, model: type, job_id: str) -> int:
    with db.sessions() as session:
        return int(
            session.scalar(sa.select(sa.func.count()).select_from(model).where(model.job_id == job_id)) or 0
        )


def test_a_job_is_claimed_once_even_by_concurrent_workers(db: Database, job_id: str) -> None:
    barrier = threading.Barrier(4)
    results: list[repository.Claim | None] = []

    def race(owner: str) -> None:
        barrier.wait()
        results.append(claim(db, job_id, owner))

    threads = [threading.Thread(target=race, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [r for r in results if r is not None]
    assert len(winners) == 1 and winners[0].attempt == 1
    assert winners[0].resolved_spec["optim"]["steps"] == 20 and winners[0].latest_checkpoint_step is None
    assert claim(db, job_id) is None


def test_a_worker_that_lost_its_lease_writes_nothing(db: Database, job_id: str) -> None:
    first = claim(db, job_id)
    assert first is not None
    token = first.lease_token
    with db.transaction() as session:
        assert repository.heartbeat(session, job_id, token, lease_s=30) == "running"
        assert repository.record_step_metrics(session, job_id, token, 1, step_metrics(1, 0.5))
    # No heartbeat for a while: the sweeper hands the job to someone else.
    later = repository.utcnow() + timedelta(minutes=5)
    with db.transaction() as session:
        changed = repository.recover_stale_jobs(session, stale_after_s=30, now=later, limit=10_000)
    assert (job_id, "training", "recovering") in changed  # (other tests' stale jobs may be swept too)
    metrics, events, checkpoints = (
        count(db, JobMetric, job_id),
        count(db, JobEvent, job_id),
        count(db, Checkpoint, job_id),
    )
    with db.transaction() as session:
        assert repository.heartbeat(session, job_id, token, lease_s=30) is None
        assert repository.record_step_metrics(session, job_id, token, 2, step_metrics(2, 0.5)) is False
        assert repository.record_eval(session, job_id, token, 2, {"eval/avg@k": 1.0}) is False
        assert repository.add_checkpoint(session, job_id, token, 2, "x/y") is None
        assert repository.append_event(session, job_id, "note", "hi", lease_token=token) is None
        assert repository.finish_job(session, job_id, token, "succeeded") is False
        assert (
            repository.retry_job(session, job_id, token, repository.JobError("oom", "OOM", "system")) is None
        )
    assert (count(db, JobMetric, job_id), count(db, JobEvent, job_id), count(db, Checkpoint, job_id)) == (
        metrics,
        events,
        checkpoints,
    )
    second = claim(db, job_id, "w2")
    assert second is not None and second.attempt == 2 and second.lease_token != token


def test_metric_rows_are_unique_per_step_and_redone_steps_overwrite(db: Database, job_id: str) -> None:
    token = claim(db, job_id).lease_token  # type: ignore[union-attr]
    with db.transaction() as session:
        for step in (1, 2, 3, 2, 3):
            assert repository.record_step_metrics(
                session, job_id, token, step, {"entropy/mean": float(step), "x": float("inf")}
            )
    with db.sessions() as session:
        rows = session.execute(
            sa.select(JobMetric.step, JobMetric.metrics)
            .where(JobMetric.job_id == job_id)
            .order_by(JobMetric.step)
        ).all()
    assert [(s, m["entropy/mean"], m["x"]) for s, m in rows] == [
        (1, 1.0, None),
        (2, 2.0, None),
        (3, 3.0, None),
    ]


def test_checkpoints_and_events_are_idempotent(db: Database, job_id: str) -> None:
    token = claim(db, job_id).lease_token  # type: ignore[union-attr]
    with db.transaction() as session:
        first = repository.add_checkpoint(session, job_id, token, 50, "t/j/run/checkpoints/step-000050")
        again = repository.add_checkpoint(
            session, job_id, token, 50, "t/j/run/checkpoints/step-000050", size=10
        )
        later = repository.add_checkpoint(session, job_id, token, 100, "t/j/run/checkpoints/step-000100")
        seq = repository.append_event(
            session, job_id, "job.checkpoint", "saved", lease_token=token, dedupe_key="1:ckpt:50"
        )
        same = repository.append_event(
            session, job_id, "job.checkpoint", "saved", lease_token=token, dedupe_key="1:ckpt:50"
        )
    assert first == again and later not in (None, first) and seq == same
    assert count(db, Checkpoint, job_id) == 2
    with db.sessions() as session:
        latest = repository.latest_checkpoint(session, job_id)
        assert latest is not None and latest.step == 100
    assert claim(db, job_id) is None


def test_system_errors_are_retried_up_to_max_attempts_and_user_errors_never(
    db: Database, job_id: str
) -> None:
    oom = repository.JobError("oom", "CUDA out of memory", "system")
    statuses = []
    for attempt, step in ((1, 2), (2, 4), (3, 6)):  # progress between crashes: no crash_loop (issue 12)
        current = claim(db, job_id)
        assert current is not None and current.attempt == attempt
        with db.transaction() as session:
            assert repository.record_step_metrics(
                session, job_id, current.lease_token, step, step_metrics(step, 0.5)
            )
            statuses.append(repository.retry_job(session, job_id, current.lease_token, oom))
    assert statuses == ["recovering", "recovering", "failed"]
    with db.sessions() as session:
        job = repository.load_job(session, job_id)
        assert job is not None and (job.error_code, job.error_category) == ("oom", "system")
    with db.transaction() as session, pytest.raises(ValueError):
        repository.retry_job(session, job_id, "token", repository.JobError("bad_data", "x", "user"))


def test_stale_cancelling_and_pausing_jobs_settle(
    client: TestClient, tenant: TenantKey, db: Database, make_tenant: Callable[[], TenantKey]
) -> None:
    cancelling, pausing = create_job(client, tenant.headers), create_job(client, tenant.headers)
    for job in (cancelling, pausing):
        assert claim(db, job) is not None
    client.post(f"/v1/jobs/{cancelling}/cancel", headers=tenant.headers)
    client.post(f"/v1/jobs/{pausing}/pause", headers=tenant.headers)
    later = repository.utcnow() + timedelta(minutes=5)
    with db.transaction() as session:
        changed = {
            j: s
            for j, _, s in repository.recover_stale_jobs(session, stale_after_s=30, now=later, limit=10_000)
        }
    assert changed[cancelling] == "cancelled" and changed[pausing] == "paused"


def test_a_worker_lost_too_often_fails_the_job_as_a_system_error(db: Database, job_id: str) -> None:
    later = repository.utcnow()
    for _ in range(DEFAULT_MAX_LOST_WORKERS):  # 10: lost workers have their own budget (issue 12)
        assert claim(db, job_id) is not None
        later += timedelta(minutes=5)
        with db.transaction() as session:
            repository.recover_stale_jobs(session, stale_after_s=30, now=later, limit=10_000)
    with db.sessions() as session:
        job = repository.load_job(session, job_id)
        assert job is not None and job.status == "failed"
        assert (job.error_code, job.error_category) == ("worker_lost", "system")
        assert (job.lost_workers, job.failures) == (DEFAULT_MAX_LOST_WORKERS, 0)


def test_a_job_failed_on_a_system_fault_resumes_with_fresh_budgets_and_a_user_error_does_not(
    client: TestClient, tenant: TenantKey, db: Database, job_id: str
) -> None:
    current = claim(db, job_id)
    assert current is not None
    with db.transaction() as session:
        assert repository.record_step_metrics(session, job_id, current.lease_token, 3, step_metrics(3, 0.5))
        assert repository.add_checkpoint(session, job_id, current.lease_token, 2, f"{job_id}/run/step-2")
        full = repository.JobError(
            "storage_full", "cannot write /x: ENOSPC (No space left on device)", "system"
        )
        assert repository.finish_job(session, job_id, current.lease_token, "failed", error=full)
    response = client.post(f"/v1/jobs/{job_id}/resume", headers=tenant.headers)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["status"], body["error"], body["failures"], body["lost_workers"]) == ("queued", None, 0, 0)
    events = client.get(f"/v1/jobs/{job_id}/events", headers=tenant.headers).json()["data"]
    assert events[-1]["type"] == "job.resumed" and events[-1]["data"] == {"after_error": "storage_full"}
    again = claim(db, job_id)
    assert again is not None and again.attempt == 2 and again.latest_checkpoint_step == 2

    with db.transaction() as session:
        bad = repository.JobError("non_finite", "non-finite loss at step 3", "user")
        assert repository.finish_job(session, job_id, again.lease_token, "failed", error=bad)
    response = client.post(f"/v1/jobs/{job_id}/resume", headers=tenant.headers)
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "job_not_resumable"
    assert client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["status"] == "failed"
