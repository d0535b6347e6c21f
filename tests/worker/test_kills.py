"""Reliability 1: kill -9 the worker (and, separately, the trainer child) three times in one job.

The job must end succeeded, each new attempt resuming from the latest checkpoint (the latest checkpoint row
when the attempt was lost), redoing at most the checkpoint interval, with metric rows for steps 1..N exactly
once. With the default budgets (max_attempts 3, max_lost_workers 10): both kinds of kill are the
infrastructure's doing (a lost worker; a trainer SIGKILLed by something other than its worker, as the OOM
killer or an operator would), so they spend lost_workers and leave the crash budget (failures) at 0.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import psutil
import pytest

from tests.worker.harness import (
    STALE_AFTER_S,
    Harness,
    assert_steps_exactly_once,
    event_time,
    record_figures,
    tiny_spec,
)

pytestmark = pytest.mark.slow  # real servers, workers and trainers: the suite takes minutes

STEPS = 20  # the third kill lands near step 9-11: the last attempt still has steps to run
INTERVAL = 2
KILLS = 3


def _completed_steps(h: Harness, job_id: str) -> int:
    """The last step the lost trainer finished: the most of what the database got and what the trainer wrote
    to its own events.jsonl (read before the next attempt rewrites it)."""
    on_disk = max((e["step"] for e in h.trainer_events(job_id) if e.get("type") == "step"), default=0)
    return max(on_disk, h.max_step(job_id))


def _latest_checkpoint_row(h: Harness, job_id: str) -> int:
    return max(c["step"] for c in h.checkpoints(job_id))


def _checkpoint_before_attempt(h: Harness, job_id: str, attempt: int) -> int:
    """The step of the last checkpoint recorded before `attempt` was claimed (events are in order)."""
    events = h.events(job_id)
    claim = next(e for e in events if e["type"] == "job.running" and e["data"]["attempt"] == attempt)
    return max(
        e["data"]["step"] for e in events if e["type"] == "checkpoint.created" and e["id"] < claim["id"]
    )


def _check_resumes(h: Harness, job_id: str, kills: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """Shared checks after the job succeeded; returns the figures."""
    context = h.diagnostics(job_id)
    row = h.job_row(job_id)
    assert row["status"] == "succeeded", context
    assert row["attempt"] == KILLS + 1, f"one attempt per kill plus the first\n{context}"
    assert row["lost_workers"] == KILLS, f"each kill spends the lost-worker budget\n{context}"
    assert row["failures"] == 0, f"a kill is no trainer crash\n{context}"
    assert row["current_step"] == STEPS, context

    events = h.events(job_id)
    running = [e for e in events if e["type"] == "job.running"]
    resumed = [e for e in events if e["type"] == "trainer.resumed"]
    recovering = [e for e in events if e["type"] == "job.recovering"]
    assert [e["data"]["attempt"] for e in running] == list(range(1, KILLS + 2)), context
    assert running[0]["data"]["resume_step"] is None, context
    assert len(resumed) == KILLS, f"every later attempt resumes from a checkpoint\n{context}"
    assert len(recovering) == KILLS, context

    redone = []
    for i, kill in enumerate(kills):
        # The attempt after kill i resumed from the latest checkpoint row as it stood when the attempt died,
        # both as the claim saw it and as the trainer loaded it.
        assert running[i + 1]["data"]["resume_step"] == kill["latest_checkpoint"], context
        assert resumed[i]["data"]["step"] == kill["latest_checkpoint"], context
        steps_redone = kill["completed"] - kill["latest_checkpoint"]
        assert 0 <= steps_redone <= INTERVAL, f"kill {i + 1}: redid {steps_redone} steps\n{context}"
        redone.append(steps_redone)
        kill["detect_s"] = round(event_time(recovering[i]) - kill["time"], 2)
        kill["resumed_s"] = round(event_time(resumed[i]) - kill["time"], 2)

    rows = h.metric_rows(job_id)
    assert_steps_exactly_once(rows, STEPS, context)
    attempts = [attempt for _, attempt, _ in rows]
    assert attempts == sorted(attempts), f"a later attempt never writes below an earlier one: {attempts}"
    assert set(attempts) == set(range(1, KILLS + 2)), f"every attempt wrote steps: {attempts}"
    for attempt in range(2, KILLS + 2):
        first = min(step for step, a, _ in rows if a == attempt)
        assert first == kills[attempt - 2]["latest_checkpoint"] + 1, (
            f"attempt {attempt} starts right after the checkpoint it resumed from: {attempts}"
        )
    assert sorted(h.trainer_logs(job_id)) == [f"trainer-attempt-{a}.log" for a in range(1, KILLS + 2)]
    assert max(c["step"] for c in h.checkpoints(job_id)) == STEPS

    figures = {
        "steps": STEPS,
        "checkpoint_interval": INTERVAL,
        "killed_at_step": [k["completed"] for k in kills],
        "resumed_from": [k["latest_checkpoint"] for k in kills],
        "steps_redone": redone,
        "detect_s": [k["detect_s"] for k in kills],
        "kill_to_resumed_s": [k["resumed_s"] for k in kills],
    }
    record_figures(name, **figures)
    return figures


def test_worker_kill9_three_times(make_harness: Any) -> None:
    h = make_harness()  # the default budgets: max_attempts 3 would not cover three kills if they counted
    assert h.settings.max_attempts <= KILLS
    worker = h.start_worker()
    job_id = h.post_job(tiny_spec(STEPS, INTERVAL))
    kills: list[dict[str, Any]] = []
    resume_from = 0
    for i in range(KILLS):
        # Kill one step into an interval, past the next checkpoint: the next attempt has something to resume.
        h.wait_step(job_id, resume_from + INTERVAL + 1, timeout=150)
        assert worker.trainers(), f"the worker supervises a trainer\n{h.diagnostics(job_id)}"
        killed_at = time.time()
        trainers = worker.kill9()
        _, alive = psutil.wait_procs(trainers, timeout=15)
        assert not alive, f"kill -9 of the worker left its trainer running: {alive}"
        row = h.job_row(job_id)
        assert row["status"] == "running", "nothing notices a dead worker before the sweeper"
        kill = {
            "time": killed_at,
            "last_heartbeat": row["heartbeat_at"].timestamp(),
            "completed": _completed_steps(h, job_id),
            "latest_checkpoint": _latest_checkpoint_row(h, job_id),
        }
        kills.append(kill)
        # A fresh worker (with the sweeper): notices the stale heartbeat, re-sends, claims, resumes.
        worker = h.start_worker()
        h.wait_for(
            f"attempt {i + 2} to start",
            lambda n=i + 2: h.job_row(job_id)["attempt"] >= n and h.job_row(job_id)["status"] == "running",
            timeout=STALE_AFTER_S + 60,
            job_id=job_id,
        )
        resume_from = kill["latest_checkpoint"]
    h.wait_status(job_id, "succeeded", timeout=240)
    _check_resumes(h, job_id, kills, "test_worker_kill9_three_times")
    recovering = [e for e in h.events(job_id) if e["type"] == "job.recovering"]
    assert [e["data"] for e in recovering] == [
        {"reason": "worker_lost", "lost_workers": n} for n in range(1, KILLS + 1)
    ]
    for kill, event in zip(kills, recovering):
        silence = event_time(event) - kill["last_heartbeat"]
        assert silence >= STALE_AFTER_S, f"recovered after only {silence:.2f} s without a heartbeat"


def test_trainer_kill9_three_times(make_harness: Any) -> None:
    h = make_harness()
    assert h.settings.max_attempts <= KILLS
    worker = h.start_worker()
    job_id = h.post_job(tiny_spec(STEPS, INTERVAL))
    kills: list[dict[str, Any]] = []
    resume_from = 0
    for i in range(KILLS):
        h.wait_step(job_id, resume_from + INTERVAL + 1, timeout=150)
        trainers = worker.trainers()
        assert len(trainers) == 1, f"one trainer per job: {trainers}\n{h.diagnostics(job_id)}"
        killed_at = time.time()
        trainers[0].send_signal(signal.SIGKILL)
        psutil.wait_procs(trainers, timeout=15)
        kill: dict[str, Any] = {"time": killed_at, "completed": _completed_steps(h, job_id)}
        # The worker drains what the trainer printed, then retries: recovering, re-sent, claimed again.
        h.wait_for(
            f"attempt {i + 2} to start",
            lambda n=i + 2: h.job_row(job_id)["attempt"] >= n and h.job_row(job_id)["status"] == "running",
            timeout=60,
            job_id=job_id,
        )
        kill["latest_checkpoint"] = _checkpoint_before_attempt(h, job_id, i + 2)
        kills.append(kill)
        resume_from = kill["latest_checkpoint"]
        assert worker.alive(), "the worker survives its trainer's death"
    h.wait_status(job_id, "succeeded", timeout=240)
    _check_resumes(h, job_id, kills, "test_trainer_kill9_three_times")
    assert len(h.workers) == 1 and worker.alive()
    recovering = [e for e in h.events(job_id) if e["type"] == "job.recovering"]
    assert [e["data"]["error"]["code"] for e in recovering] == ["trainer_killed"] * KILLS
    for event in recovering:
        assert event["data"]["budget"] == "lost-worker", event
        assert event["message"].startswith("trainer was killed by SIGKILL"), event
