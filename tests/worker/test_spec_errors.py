"""A job whose spec the trainer refuses fails at once as the tenant's error, never as a crash loop (issue 32,
N9): a job stored with `sampling.temperature: 1e-300` (below contract.spec.MIN_TEMPERATURE, accepted before
the bound existed) ends `failed`, category user, code invalid_job, after one attempt, the message naming the
field; before, torch.multinomial crashed twice and the job ended crash_loop, a system failure."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from store.models import Job
from tests.worker.harness import Harness, tiny_spec

pytestmark = pytest.mark.slow  # real servers, workers and trainers


def test_a_spec_the_trainer_refuses_is_a_user_error_on_the_first_attempt(harness: Harness) -> None:
    h = harness
    job_id = h.post_job(tiny_spec(4))

    def stored_before_the_bound(session: sa.orm.Session) -> None:
        spec = dict(session.scalars(sa.select(Job.resolved_spec).where(Job.id == job_id)).one())
        spec["sampling"] = {**spec["sampling"], "temperature": 1e-300}
        session.execute(sa.update(Job).where(Job.id == job_id).values(resolved_spec=spec))

    h.infra.db_retry(stored_before_the_bound)
    h.start_worker()
    h.wait_status(job_id, ("failed", "succeeded", "cancelled"), timeout=180)
    context = h.diagnostics(job_id)
    job = h.job(job_id)
    assert job["status"] == "failed", context
    error = job["error"]
    assert (error["category"], error["code"]) == ("user", "invalid_job"), context
    assert "sampling.temperature" in error["message"], context
    assert job["attempt"] == 1 and job["failures"] == 0, f"a user error is never retried\n{context}"
