"""The evaluation report, built by trainer.report from the job's stored history, as JSON and as HTML."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from store import repository
from store.database import Database
from tests.service.conftest import TenantKey
from tests.service.helpers import FakeWorker, create_job, step_metrics


def test_report_json_and_html(client: TestClient, tenant: TenantKey, db: Database) -> None:
    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    with db.transaction() as session:
        assert repository.record_eval(
            session, job_id, worker.token, 0, {"eval/avg@k": 0.2, "eval/pass@k": 0.2, "eval/k": 1}
        )
        for step in range(1, 11):
            state = -1 if step > 8 else 0
            metrics = step_metrics(step, 0.05 if step > 8 else 0.5, state=state, out_of_band=max(step - 8, 0))
            assert repository.record_step_metrics(session, job_id, worker.token, step, metrics)
        assert repository.record_eval(
            session, job_id, worker.token, 10, {"eval/avg@k": 0.5, "eval/pass@k": 0.5, "eval/k": 1}
        )
    worker.finish("succeeded")

    report = client.get(f"/v1/jobs/{job_id}/report", headers=tenant.headers).json()
    assert report["job"]["id"] == job_id and report["job"]["status"] == "succeeded"
    assert report["job"]["steps_done"] == 10 and report["job"]["total_steps"] == 20
    assert report["evaluation"]["delta"]["avg_at_k"] == pytest.approx(0.3)
    assert report["entropy"]["steps_below"] == 2 and report["entropy"]["last_state"] == "below"
    assert report["entropy"]["band_low"] == 0.1

    page = client.get(f"/v1/jobs/{job_id}/report", params={"format": "html"}, headers=tenant.headers)
    assert page.headers["content-type"].startswith("text/html")
    assert page.text.startswith("<!doctype html>") and "<svg" in page.text and "<script" not in page.text
    assert (
        client.get(f"/v1/jobs/{job_id}/report", headers={**tenant.headers, "Accept": "text/html"}).text
        == page.text
    )


def test_a_report_of_a_job_that_has_not_started_is_empty_but_valid(
    client: TestClient, tenant: TenantKey
) -> None:
    job_id = create_job(client, tenant.headers)
    report = client.get(f"/v1/jobs/{job_id}/report", headers=tenant.headers).json()
    assert report["job"]["steps_done"] == 0 and report["evaluation"]["history"] == []
    assert client.get(f"/v1/jobs/{job_id}/report?format=html", headers=tenant.headers).status_code == 200
