"""The retry budgets on real PostgreSQL (issue 12), through the repository functions the worker and the
sweeper call, and the worker's own storage faults after a claim (run_claimed, no trainer started).

Budgets (service/models.py): trainer crashes spend `failures` (the job fails at the max_attempts-th); lost
workers and trainers SIGKILLed from outside spend `lost_workers` (fails at the max_lost_workers-th, 10);
a failure whose attempt completed no step, right after another failure, fails the job at once with
`crash_loop` (issue 44, N15: progress is counted per attempt, from the checkpoint it resumed from).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from store import repository
from store.database import Database
from store.models import CRASH_LOOP_STREAK, DEFAULT_MAX_LOST_WORKERS, JobEvent
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
from worker.training import run_claimed

CRASH = repository.JobError("trainer_crashed", "trainer exited with code 1: RuntimeError: boom", "system")
KILLED = repository.JobError("trainer_killed", "trainer was killed by SIGKILL and printed no error", "system")


@pytest.fixture
def job_id(client: TestClient, tenant: TenantKey) -> str:  # noqa: F811
    return create_job(client, tenant.headers)


def _claim(db: Database, job_id: str) -> repository.Claim:  # noqa: F811
    with db.transaction() as session:
        claim = repository.claim_job(session, job_id, owner="budget-test", lease_s=30)
    assert claim is not None, "the job is claimable"
    return claim


def _steps(db: Database, claim: repository.Claim, up_to: int) -> None:  # noqa: F811
    with db.transaction() as session:
        for step in range(1, up_to + 1):
            assert repository.record_step_metrics(
                session, claim.job_id, claim.lease_token, step, step_metrics(step, 0.5)
            )


def _retry(
    db: Database,  # noqa: F811
    claim: repository.Claim,
    error: repository.JobError = CRASH,
    *,
    infrastructure: bool = False,
) -> str | None:
    with db.transaction() as session:
        return repository.retry_job(
            session, claim.job_id, claim.lease_token, error, infrastructure=infrastructure
        )


def _lose_worker(db: Database, job_id: str, when: Any) -> str:  # noqa: F811
    with db.transaction() as session:
        changed = repository.recover_stale_jobs(session, stale_after_s=30, now=when, limit=10_000)
    return next(status for jid, _, status in changed if jid == job_id)


def _events(db: Database, job_id: str, kind: str | None = None) -> list[Any]:  # noqa: F811
    """The job's events, oldest first (detached rows), of one type when `kind` is given."""
    with db.sessions() as session:
        query = sa.select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.seq)
        rows = [e for e in session.scalars(query) if kind is None or e.type == kind]
        for row in rows:
            session.expunge(row)
        return rows


def _job(db: Database, job_id: str) -> Any:  # noqa: F811
    with db.sessions() as session:
        job = repository.load_job(session, job_id)
        assert job is not None
        session.expunge(job)
        return job


def _checkpoint(db: Database, claim: repository.Claim, step: int) -> None:  # noqa: F811
    with db.transaction() as session:
        relative = f"{claim.run_dir}/checkpoints/step-{step:06d}"
        assert repository.add_checkpoint(session, claim.job_id, claim.lease_token, step, relative) is not None


def test_the_streak_counts_failures_whose_attempt_completed_no_step() -> None:
    assert repository.crash_streak_after(0, False) == 1  # the first failure, nothing done
    assert repository.crash_streak_after(1, False) == 2  # again nothing: a loop
    assert repository.crash_streak_after(1, True) == 1  # the attempt completed a step: a new streak
    assert repository.crash_streak_after(0, True) == 1
    assert CRASH_LOOP_STREAK == 2 and DEFAULT_MAX_LOST_WORKERS == 10


def test_crashes_that_make_progress_spend_the_crash_budget(db: Database, job_id: str) -> None:  # noqa: F811
    statuses = []
    for attempt, step in ((1, 2), (2, 4), (3, 6)):
        claim = _claim(db, job_id)
        assert claim.attempt == attempt
        _steps(db, claim, step)
        statuses.append(_retry(db, claim))
    assert statuses == ["recovering", "recovering", "failed"]  # max_attempts 3: fails at the 3rd crash
    job = _job(db, job_id)
    assert (job.error_code, job.error_category, job.error_message) == (
        "trainer_crashed",
        "system",
        CRASH.message,
    )
    assert (job.failures, job.lost_workers, job.crash_streak, job.crash_step) == (3, 0, 1, 6)


def test_two_crashes_at_one_step_are_a_crash_loop(db: Database, job_id: str) -> None:  # noqa: F811
    first = _claim(db, job_id)
    _steps(db, first, 2)
    _checkpoint(db, first, 2)
    assert _retry(db, first) == "recovering"
    second = _claim(db, job_id)  # resumed from the checkpoint at 2, crashed again before completing step 3
    assert _retry(db, second) == "failed"
    job = _job(db, job_id)
    assert (job.error_code, job.error_category) == ("crash_loop", "system")
    assert job.error_message == (
        "the trainer failed 2 times in a row and the last attempt completed no step: it resumed from step 2 "
        "and failed before finishing step 3 (the furthest step any attempt reached: 2); last: trainer exited "
        "with code 1: RuntimeError: boom"
    )
    assert (job.attempt, job.failures, job.crash_streak) == (2, 2, 2)
    failed = _events(db, job_id, "job.failed")
    assert len(failed) == 1 and failed[0].data["error"]["code"] == "crash_loop"


def test_lost_workers_spend_their_own_budget(db: Database, job_id: str) -> None:  # noqa: F811
    when = repository.utcnow()
    statuses = []
    for _ in range(DEFAULT_MAX_LOST_WORKERS):
        claim = _claim(db, job_id)
        _steps(db, claim, 1)  # the same step every time: a lost worker is no crash streak
        when += timedelta(minutes=5)
        statuses.append(_lose_worker(db, job_id, when))
    assert statuses == ["recovering"] * (DEFAULT_MAX_LOST_WORKERS - 1) + ["failed"]
    job = _job(db, job_id)
    assert (job.error_code, job.error_category) == ("worker_lost", "system")
    assert "10 lost workers" in job.error_message
    assert (job.lost_workers, job.failures, job.crash_streak) == (10, 0, 0)


def test_three_lost_workers_leave_the_crash_budget_whole(db: Database, job_id: str) -> None:  # noqa: F811
    when = repository.utcnow()
    for _ in range(3):
        _claim(db, job_id)
        when += timedelta(minutes=5)
        assert _lose_worker(db, job_id, when) == "recovering"
    for step in (2, 4):  # then two crashes, with progress: still within max_attempts 3
        claim = _claim(db, job_id)
        _steps(db, claim, step)
        assert _retry(db, claim) == "recovering"
    job = _job(db, job_id)
    assert (job.attempt, job.lost_workers, job.failures, job.status) == (5, 3, 2, "recovering")


def _steps_from(db: Database, claim: repository.Claim, first: int, last: int) -> None:  # noqa: F811
    with db.transaction() as session:
        for step in range(first, last + 1):
            assert repository.record_step_metrics(
                session, claim.job_id, claim.lease_token, step, step_metrics(step, 0.5)
            )


def test_n15_two_kills_within_one_checkpoint_interval_are_progress_not_a_loop(
    db: Database,  # noqa: F811
    job_id: str,
) -> None:
    """The finding: 40 steps, checkpoints every 10, killed at 15, then at 12 of the re-run that resumed from
    10. The re-run completed steps 11 and 12: it was progressing, though no attempt passed 15. Before, the
    job ended crash_loop with lost_workers 2 of 10."""
    first = _claim(db, job_id)
    _steps_from(db, first, 1, 15)
    _checkpoint(db, first, 10)
    assert _retry(db, first, KILLED, infrastructure=True) == "recovering"
    second = _claim(db, job_id)
    _steps_from(db, second, 11, 12)  # resumed from the checkpoint at 10
    assert _retry(db, second, KILLED, infrastructure=True) == "recovering"
    job = _job(db, job_id)
    assert (job.status, job.lost_workers, job.crash_streak, job.crash_step) == ("recovering", 2, 1, 15)
    third = _claim(db, job_id)  # and the job goes on to finish its steps
    _steps_from(db, third, 11, 40)
    assert _job(db, job_id).current_step == 40


def test_n15_attempts_that_never_pass_step_0_are_a_loop(db: Database, job_id: str) -> None:  # noqa: F811
    """Killed right after each start, before a step: no attempt makes progress. Before, three such kills
    succeeded with lost_workers 3; now the second is a crash loop (the third is never spent)."""
    for attempt, expected in ((1, "recovering"), (2, "failed")):
        claim = _claim(db, job_id)
        assert claim.attempt == attempt
        assert _retry(db, claim, KILLED, infrastructure=True) == expected
    job = _job(db, job_id)
    assert (job.error_code, job.lost_workers, job.crash_streak) == ("crash_loop", 2, 2)
    assert job.error_message.startswith(
        "the trainer failed 2 times in a row and the last attempt completed no step: it resumed from step 0 "
        "and failed before finishing step 1 (the furthest step any attempt reached: 0); last: trainer was "
        "killed by SIGKILL"
    ), job.error_message


def test_a_job_whose_furthest_step_keeps_rising_is_not_a_loop(db: Database, job_id: str) -> None:  # noqa: F811
    """Each attempt resumes from the last checkpoint and gets further before it is killed: never a loop,
    whatever the kills cost; only the lost-worker budget ends it."""
    resumed = 0
    for kill in range(3, 3 + 2 * (DEFAULT_MAX_LOST_WORKERS - 1), 2):
        claim = _claim(db, job_id)
        _steps_from(db, claim, resumed + 1, kill)
        _checkpoint(db, claim, kill - 1)
        resumed = kill - 1
        assert _retry(db, claim, KILLED, infrastructure=True) == "recovering"
    claim = _claim(db, job_id)
    _steps_from(db, claim, resumed + 1, resumed + 2)
    assert _retry(db, claim, KILLED, infrastructure=True) == "failed"
    job = _job(db, job_id)
    assert (job.error_code, job.lost_workers, job.crash_streak) == ("trainer_killed", 10, 1)


def test_progress_after_a_lost_worker_starts_a_new_streak(
    db: Database,  # noqa: F811
    job_id: str,
) -> None:
    """Attempt 1 reaches 15 and its worker is lost (no crash); attempts 2 and 3 each resume at 10 and
    crash at 12 and at 14: each completed steps, so neither is a loop (the crash budget still runs out)."""
    first = _claim(db, job_id)
    _steps_from(db, first, 1, 15)
    _checkpoint(db, first, 10)
    assert _lose_worker(db, job_id, repository.utcnow() + timedelta(minutes=5)) == "recovering"
    second = _claim(db, job_id)
    _steps_from(db, second, 11, 12)
    assert _retry(db, second) == "recovering"
    third = _claim(db, job_id)
    _steps_from(db, third, 11, 14)
    assert _retry(db, third) == "recovering"
    job = _job(db, job_id)
    assert (job.failures, job.crash_streak, job.error_code) == (2, 1, None)


def test_a_lost_worker_between_two_crashes_at_one_step_does_not_hide_the_loop(
    db: Database,  # noqa: F811
    job_id: str,
) -> None:
    claim = _claim(db, job_id)
    _steps(db, claim, 4)
    _checkpoint(db, claim, 4)
    assert _retry(db, claim) == "recovering"
    _claim(db, job_id)
    assert _lose_worker(db, job_id, repository.utcnow() + timedelta(minutes=5)) == "recovering"
    claim = _claim(db, job_id)  # resumed from 4, crashed before completing 5
    assert _retry(db, claim) == "failed"
    assert _job(db, job_id).error_code == "crash_loop"


def test_a_trainer_killed_from_outside_spends_the_lost_worker_budget(db: Database, job_id: str) -> None:  # noqa: F811
    for step in (3, 5, 7, 9):  # four kills, with progress: more than max_attempts, well within 10
        claim = _claim(db, job_id)
        _steps_from(db, claim, step - 2 if step > 3 else 1, step)
        _checkpoint(db, claim, step)
        assert _retry(db, claim, KILLED, infrastructure=True) == "recovering"
    job = _job(db, job_id)
    assert (job.lost_workers, job.failures, job.crash_streak) == (4, 0, 1)
    claim = _claim(db, job_id)  # killed again before completing a step: the OOM killer's signature
    assert _retry(db, claim, KILLED, infrastructure=True) == "failed"
    job = _job(db, job_id)
    assert job.error_code == "crash_loop" and "SIGKILL" in job.error_message
    assert (job.lost_workers, job.failures) == (5, 0)


def test_a_retry_after_the_lease_was_lost_writes_nothing(db: Database, job_id: str) -> None:  # noqa: F811
    claim = _claim(db, job_id)
    assert _lose_worker(db, job_id, repository.utcnow() + timedelta(minutes=5)) == "recovering"
    assert _retry(db, claim) is None
    job = _job(db, job_id)
    assert (job.status, job.failures, job.lost_workers, job.crash_streak) == ("recovering", 0, 1, 0)


def test_the_job_view_shows_the_budgets(client: TestClient, tenant: TenantKey, db: Database) -> None:  # noqa: F811
    job_id = create_job(client, tenant.headers)
    claim = _claim(db, job_id)
    _steps(db, claim, 2)
    assert _retry(db, claim) == "recovering"
    _claim(db, job_id)
    assert _lose_worker(db, job_id, repository.utcnow() + timedelta(minutes=5)) == "recovering"
    body = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()
    assert {
        k: body[k] for k in ("attempt", "failures", "max_attempts", "lost_workers", "max_lost_workers")
    } == {
        "attempt": 2,
        "failures": 1,
        "max_attempts": 3,
        "lost_workers": 1,
        "max_lost_workers": DEFAULT_MAX_LOST_WORKERS,
    }


# ------------------------------------------------------------------ the worker's own writes after a claim


def _worker_settings(pg_url: str, root: Path, **extra: Any) -> WorkerSettings:  # noqa: F811
    return WorkerSettings(database_url=pg_url, artifact_root=root, db_retry_max_s=5.0, **extra)


def test_a_run_folder_that_cannot_be_written_fails_the_job_without_a_trainer(
    db: Database,  # noqa: F811
    job_id: str,
    pg_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    claim = _claim(db, job_id)
    root = tmp_path / "artifacts"
    root.mkdir()
    (root / claim.tenant_id).write_text("a file where the tenant's folder should be")  # mkdir fails
    resent: list[str] = []
    status = run_claimed(db, claim, _worker_settings(pg_url, root), lambda j, q: resent.append(j))
    assert status == "failed" and resent == []
    job = _job(db, job_id)
    assert (job.status, job.error_code, job.error_category) == ("failed", "storage_io_error", "system")
    # The path as the tenant sees it, relative to its folder; the server's root is not shown (issue 21).
    assert f"cannot write {claim.job_id}/run:" in job.error_message, job.error_message
    assert str(root.resolve()) not in job.error_message and str(root) not in job.error_message
    assert "EEXIST" in job.error_message or "ENOTDIR" in job.error_message, job.error_message
    assert (job.attempt, job.failures, job.lost_workers) == (1, 0, 0), "not retried, no budget spent"
    assert [e.type for e in _events(db, job_id)] == ["job.created", "job.running", "job.failed"]


def test_a_trainer_that_cannot_start_is_a_crash(
    db: Database,  # noqa: F811
    job_id: str,
    pg_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    claim = _claim(db, job_id)
    resent: list[str] = []
    broken = _worker_settings(pg_url, tmp_path / "artifacts", python=str(tmp_path / "no-such-python"))
    assert run_claimed(db, claim, broken, lambda j, q: resent.append(j)) == "recovering"
    assert resent == [job_id]
    job = _job(db, job_id)
    assert (job.status, job.failures, job.lost_workers) == ("recovering", 1, 0)
    recovering = _events(db, job_id, "job.recovering")
    assert len(recovering) == 1
    assert recovering[0].message.startswith("cannot start the trainer: [Errno 2]"), recovering[0].message
