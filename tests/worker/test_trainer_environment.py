"""A real worker's trainer child holds none of the worker's secrets: not the database or broker URL the
worker itself runs on, not a planted credential; it still gets what it needs and trains to the end."""

from __future__ import annotations

import uuid

import pytest

from tests.worker.harness import Harness, tiny_spec

pytestmark = pytest.mark.slow  # real servers, workers and trainers

CANARY = f"CANARY{uuid.uuid4().hex[:12]}"


def test_the_trainer_child_of_a_real_worker_has_no_secret(harness: Harness) -> None:
    h = harness
    worker = h.start_worker(
        env={"AWS_SECRET_ACCESS_KEY": CANARY, "STARE_API_TOKEN": CANARY, "OMP_NUM_THREADS": "1"}
    )
    worker_env = h.worker_env()
    job_id = h.post_job(tiny_spec(4, 2))
    trainer = h.wait_trainer(worker)
    env = trainer.environ()
    context = h.diagnostics(job_id)
    assert CANARY not in repr(env), context
    for name in ("STARE_DATABASE_URL", "STARE_BROKER_URL", "STARE_ARTIFACT_ROOT", "AWS_SECRET_ACCESS_KEY"):
        assert name not in env, (name, context)
    assert worker_env["STARE_DATABASE_URL"] not in repr(env), context
    assert env["STARE_STEP_DELAY_S"] == worker_env["STARE_STEP_DELAY_S"], context
    assert (env["OMP_NUM_THREADS"], env["PYTHONUNBUFFERED"]) == ("1", "1"), context
    h.wait_status(job_id, "succeeded", timeout=180)  # the allow-list holds all it needs to train
