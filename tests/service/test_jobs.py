"""Jobs over HTTP: create (Idempotency-Key), list (cursor, status), get (progress, ETA, latest metrics, entropy
status, error), cancel, pause, resume, delete."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.queue import RecordingJobQueue
from store import repository
from store.database import Database
from tests.service.conftest import TenantKey
from tests.service.helpers import TINY_SPEC, FakeWorker, create_job, step_metrics
from tests.service.test_errors import assert_error


def recorded(client: TestClient) -> RecordingJobQueue:
    queue = client.app.state.services.queue  # type: ignore[attr-defined]
    assert isinstance(queue, RecordingJobQueue)
    return queue


def test_create_returns_a_committed_queued_job_and_rings_the_doorbell(
    client: TestClient, tenant: TenantKey
) -> None:
    response = client.post(
        "/v1/jobs", json={"spec": TINY_SPEC, "metadata": {"team": "rl"}}, headers=tenant.headers
    )
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["status"] == "queued" and job["metadata"] == {"team": "rl"}
    assert job["progress"] == {
        "step": 0,
        "total_steps": 20,
        "fraction": 0.0,
        "step_seconds": None,
        "eta_seconds": None,
        "estimated_finish": None,
    }
    assert job["entropy"] == {
        "value": None,
        "band": {"low": 0.1, "high": 1.0},
        "state": None,
        "steps_out_of_band": None,
        "target": None,  # no step metrics yet, so no resolved target
        "collapse_step": None,  # nor collapse or holding (contract/stability.py)
        "target_hold_fraction": None,
        "post_gate_steps": None,
    }
    assert job["spec"]["algorithm"]["advantage"] == "grpo"  # resolved defaults
    assert (job["id"], "training") in recorded(client).sent
    events = client.get(f"/v1/jobs/{job['id']}/events", headers=tenant.headers).json()["data"]
    assert [e["type"] for e in events] == ["job.created"]


def test_idempotency_key_replays_and_refuses_a_different_body(client: TestClient, tenant: TenantKey) -> None:
    headers = {**tenant.headers, "Idempotency-Key": "abc-123"}
    first = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers=headers)
    again = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    other = client.post("/v1/jobs", json={"spec": {**TINY_SPEC, "seed": 7}}, headers=headers)
    assert_error(other, 422, "idempotency_key_reused", "Idempotency-Key")
    sent = [job_id for job_id, _ in recorded(client).sent]
    assert sent.count(first.json()["id"]) == 1
    without_key = [create_job(client, tenant.headers) for _ in range(2)]
    assert len(set(without_key)) == 2
    listed = client.get("/v1/jobs", headers=tenant.headers).json()["data"]
    assert len(listed) == 3


def test_list_pages_newest_first_with_a_cursor_and_filters_by_status(
    client: TestClient, tenant: TenantKey
) -> None:
    ids = [create_job(client, tenant.headers) for _ in range(5)]
    client.post(f"/v1/jobs/{ids[1]}/cancel", headers=tenant.headers)
    seen: list[str] = []
    after = None
    while True:
        params = {"limit": 2, **({"after": after} if after else {})}
        page = client.get("/v1/jobs", params=params, headers=tenant.headers).json()
        seen += [j["id"] for j in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == list(reversed(ids))
    cancelled = client.get("/v1/jobs", params={"status": "cancelled"}, headers=tenant.headers).json()["data"]
    assert [j["id"] for j in cancelled] == [ids[1]]
    queued = client.get("/v1/jobs", params={"status": "queued"}, headers=tenant.headers).json()["data"]
    assert {j["id"] for j in queued} == set(ids) - {ids[1]}


def test_get_reports_progress_eta_latest_metrics_and_entropy_status(
    client: TestClient, tenant: TenantKey, db: Database
) -> None:
    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    worker.steps(1, 4, entropy=0.5)
    with db.transaction() as session:  # entropy collapses below the band for two steps
        for step in (5, 6):
            metrics = step_metrics(step, 0.05, state=-1, out_of_band=step - 4)
            assert repository.record_step_metrics(session, job_id, worker.token, step, metrics)
    job = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()
    assert job["status"] == "running" and job["attempt"] == 1 and job["started_at"] is not None
    progress = job["progress"]
    assert progress["step"] == 6 and progress["fraction"] == pytest.approx(6 / 20)
    assert progress["step_seconds"] == pytest.approx(2.0)
    assert progress["eta_seconds"] == pytest.approx(14 * 2.0)
    assert progress["estimated_finish"] is not None
    assert job["entropy"] == {
        "value": 0.05,
        "band": {"low": 0.1, "high": 1.0},
        "state": "below",
        "steps_out_of_band": 2,
        "target": None,  # these step metrics carry no entropy/target
        # nor the stability metrics (contract/stability.py): a job that logs none shows none
        "collapse_step": None,
        "target_hold_fraction": None,
        "post_gate_steps": None,
    }
    assert job["latest_metrics"]["step"] == 6
    assert job["latest_metrics"]["values"]["reward/accuracy"] == pytest.approx(0.31)
    # GET reads through the hot path (one statement, on the event loop on PostgreSQL); the list through the
    # ORM: the two must describe the job identically.
    listed = client.get("/v1/jobs", headers=tenant.headers).json()["data"]
    # disk_bytes is measured on GET of one job only (None in lists)
    assert job["disk_bytes"] == 0  # no worker wrote files for this one
    assert next(j for j in listed if j["id"] == job_id) == {**job, "disk_bytes": None}


def test_the_job_view_reports_collapse_and_holding_as_the_steps_logged_them(
    client: TestClient, tenant: TenantKey, db: Database
) -> None:
    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    worker.steps(1, 2, entropy=0.5)
    job = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()
    assert job["entropy"]["collapse_step"] is None
    with db.transaction() as session:
        # Not collapsed yet (the metric is 0), 3 post-gate steps, 2 of them near the target.
        metrics = {
            **step_metrics(3, 0.4),
            "entropy/target": 0.45,
            "entropy/collapse_step": 0.0,
            "entropy/post_gate_steps": 3.0,
            "entropy/target_hold_fraction": 2 / 3,
        }
        assert repository.record_step_metrics(session, job_id, worker.token, 3, metrics)
    entropy = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["entropy"]
    assert entropy["collapse_step"] is None
    assert entropy["target_hold_fraction"] == pytest.approx(2 / 3) and entropy["post_gate_steps"] == 3
    assert entropy["target"] == {"value": 0.45, "state": "below"}
    with db.transaction() as session:
        metrics = {**step_metrics(4, 0.01), "entropy/collapse_step": 4.0, "entropy/post_gate_steps": 4.0}
        assert repository.record_step_metrics(session, job_id, worker.token, 4, metrics)
    entropy = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["entropy"]
    assert entropy["collapse_step"] == 4 and entropy["post_gate_steps"] == 4
    assert entropy["target_hold_fraction"] is None  # not logged at this step


def test_a_failed_job_reports_its_error_with_category(
    client: TestClient, tenant: TenantKey, db: Database
) -> None:
    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    worker.steps(1, 3)
    error = repository.JobError("non_finite", "loss became NaN at step 3", "user", param="optim.lr")
    worker.finish("failed", error)
    job = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()
    assert job["status"] == "failed" and job["finished_at"] is not None
    assert job["error"] == {
        "code": "non_finite",
        "message": "loss became NaN at step 3",
        "param": "optim.lr",
        "category": "user",
    }
    assert job["progress"]["eta_seconds"] is None


def test_cancel_a_queued_job_never_starts_it(client: TestClient, tenant: TenantKey, db: Database) -> None:
    job_id = create_job(client, tenant.headers)
    response = client.post(f"/v1/jobs/{job_id}/cancel", headers=tenant.headers)
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=tenant.headers).json()["status"] == "cancelled"
    with db.transaction() as session:
        assert repository.claim_job(session, job_id, owner="w", lease_s=30) is None


def test_cancel_a_running_job_is_cooperative(client: TestClient, tenant: TenantKey, db: Database) -> None:
    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=tenant.headers).json()["status"] == "cancelling"
    with db.transaction() as session:
        assert repository.heartbeat(session, job_id, worker.token, lease_s=30) == "cancelling"
    worker.finish("cancelled")
    job = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()
    assert job["status"] == "cancelled"
    types = [
        e["type"] for e in client.get(f"/v1/jobs/{job_id}/events", headers=tenant.headers).json()["data"]
    ]
    assert types == ["job.created", "job.running", "job.cancel_requested", "job.cancelled"]


def test_pause_and_resume(client: TestClient, tenant: TenantKey, db: Database) -> None:
    queued = create_job(client, tenant.headers)
    assert client.post(f"/v1/jobs/{queued}/pause", headers=tenant.headers).json()["status"] == "paused"
    sent_before = len(recorded(client).sent)
    assert client.post(f"/v1/jobs/{queued}/resume", headers=tenant.headers).json()["status"] == "queued"
    assert recorded(client).sent[sent_before:] == [(queued, "training")]

    running = create_job(client, tenant.headers)
    worker = FakeWorker(db, running)
    assert client.post(f"/v1/jobs/{running}/pause", headers=tenant.headers).json()["status"] == "pausing"
    with db.transaction() as session:
        assert repository.heartbeat(session, running, worker.token, lease_s=30) == "pausing"
    worker.finish("paused")
    assert client.get(f"/v1/jobs/{running}", headers=tenant.headers).json()["status"] == "paused"
    assert client.post(f"/v1/jobs/{running}/resume", headers=tenant.headers).json()["status"] == "queued"
    second = FakeWorker(db, running)
    assert second.claim.attempt == 2
    assert_error(client.post(f"/v1/jobs/{running}/resume", headers=tenant.headers), 409, "job_not_paused")


def test_a_pause_can_be_withdrawn_before_the_worker_acts(
    client: TestClient, tenant: TenantKey, db: Database
) -> None:
    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    client.post(f"/v1/jobs/{job_id}/pause", headers=tenant.headers)
    assert client.post(f"/v1/jobs/{job_id}/resume", headers=tenant.headers).json()["status"] == "running"
    with db.transaction() as session:
        assert repository.heartbeat(session, job_id, worker.token, lease_s=30) == "running"


def test_finished_jobs_refuse_cancel_and_pause(client: TestClient, tenant: TenantKey, db: Database) -> None:
    job_id = create_job(client, tenant.headers)
    FakeWorker(db, job_id).finish("succeeded")
    assert_error(client.post(f"/v1/jobs/{job_id}/cancel", headers=tenant.headers), 409, "job_not_cancellable")
    assert_error(client.post(f"/v1/jobs/{job_id}/pause", headers=tenant.headers), 409, "job_not_pausable")


def test_only_finished_jobs_can_be_deleted_and_their_artifacts_go_too(
    client: TestClient, tenant: TenantKey, db: Database, artifact_root: Path
) -> None:
    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    worker.steps(1, 5)
    worker.checkpoint(artifact_root, 5)
    assert_error(client.delete(f"/v1/jobs/{job_id}", headers=tenant.headers), 409, "job_not_terminal")
    worker.finish("succeeded")
    assert (artifact_root / tenant.tenant_id / job_id).is_dir()
    response = client.delete(f"/v1/jobs/{job_id}", headers=tenant.headers)
    assert response.json() == {"id": job_id, "object": "job", "deleted": True}
    assert not (artifact_root / tenant.tenant_id / job_id).exists()
    assert_error(client.get(f"/v1/jobs/{job_id}", headers=tenant.headers), 404)
    assert_error(client.get(f"/v1/jobs/{job_id}/events", headers=tenant.headers), 404)


def test_the_active_job_limit_is_a_429(make_client: Callable[..., TestClient], tenant: TenantKey) -> None:
    client = make_client(max_active_jobs_per_tenant=2)
    create_job(client, tenant.headers)
    create_job(client, tenant.headers)
    estimate = client.post("/v1/jobs/estimate", json={"spec": TINY_SPEC}, headers=tenant.headers).json()
    assert estimate["allowed_to_proceed"] is False and estimate["active_jobs"] == 2
    response = client.post("/v1/jobs", json={"spec": TINY_SPEC}, headers=tenant.headers)
    assert_error(response, 429, "active_job_limit")
    assert int(response.headers["Retry-After"]) > 0


def test_estimate_resolves_defaults_and_costs_without_creating(client: TestClient, tenant: TenantKey) -> None:
    spec = {
        **TINY_SPEC,
        "sampling": {"group_size": 4, "max_new_tokens": 8},
        "optim": {"steps": 10, "prompts_per_step": 2},
    }
    estimate = client.post("/v1/jobs/estimate", json={"spec": spec}, headers=tenant.headers).json()
    assert estimate["responses_per_step"] == 8 and estimate["total_responses"] == 80
    assert estimate["max_completion_tokens"] == 640 and estimate["checkpoints"] == 2
    assert estimate["resolved_spec"]["optim"]["lr"] == 2e-4
    assert client.get("/v1/jobs", headers=tenant.headers).json()["data"] == []
