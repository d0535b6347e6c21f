"""A job whose grader fails past its error budget ends failed with code grader_failed, a user error (never
retried), its message naming the first failure; the worker reads exit code 4 (contract.protocol). The
grader is a string check over an item field the task's rows do not have, so every sample fails without
needing the grader sandbox (which a root worker's trainer cannot start: docs/GRADERS.md)."""

from __future__ import annotations

import pytest

from tests.worker.harness import Harness, tiny_spec

pytestmark = pytest.mark.slow  # real servers, workers and trainers


def test_a_failing_grader_ends_the_job_grader_failed_as_a_user_error(harness: Harness) -> None:
    h = harness
    h.start_worker()
    spec = tiny_spec(4, 2, grader={"type": "string_check", "input": "{{sample.output_text}}",
                                   "reference": "{{item.label}}", "operation": "eq"})  # fmt: skip
    del spec["verifier"]
    job_id = h.post_job(spec)
    h.wait_status(job_id, ("failed", "succeeded", "cancelled"), timeout=180)
    context = h.diagnostics(job_id)
    job = h.job(job_id)
    assert job["status"] == "failed", context
    error = job["error"]
    assert (error["category"], error["code"]) == ("user", "grader_failed"), context
    assert "the first failure, at step 1: template: item.label" in error["message"], context
    assert job["attempt"] == 1, f"a user error is never retried\n{context}"
    assert h.metric_rows(job_id) == [], context  # no step trained on a batch of failures
