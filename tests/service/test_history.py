"""A job's events (pages and Server-Sent Events with Last-Event-ID) and per-step metrics (JSON and CSV)."""

from __future__ import annotations

import csv
import io
import json

import pytest
from fastapi.testclient import TestClient

from store import repository
from store.database import Database
from tests.service.conftest import TenantKey
from tests.service.helpers import FakeWorker, create_job


def sse_events(text: str) -> list[dict[str, str]]:
    events = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line and not line.startswith(":") and ":" in line:
                name, _, value = line.partition(":")
                fields[name] = value.strip()
        if "event" in fields:
            events.append(fields)
    return events


def test_events_page_with_a_cursor(client: TestClient, tenant: TenantKey, db: Database) -> None:
    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    with db.transaction() as session:
        for i in range(5):
            seq = repository.append_event(
                session, job_id, "job.checkpoint", f"checkpoint {i}", step=i, lease_token=worker.token
            )
            assert seq is not None
    ids = []
    after = 0
    while True:
        page = client.get(
            f"/v1/jobs/{job_id}/events", params={"after": after, "limit": 3}, headers=tenant.headers
        ).json()
        ids += [e["id"] for e in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert ids == list(range(1, 8))  # created, running, 5 checkpoints


def test_the_event_stream_ends_with_the_job_and_resumes_from_last_event_id(
    client: TestClient, tenant: TenantKey, db: Database
) -> None:
    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    worker.steps(1, 3)
    worker.finish("succeeded")
    response = client.get(f"/v1/jobs/{job_id}/events", params={"stream": "true"}, headers=tenant.headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert [e["event"] for e in events] == ["job.created", "job.running", "job.succeeded", "end"]
    assert [e.get("id") for e in events[:3]] == ["1", "2", "3"]
    assert json.loads(events[2]["data"])["message"] == "Job succeeded"
    assert json.loads(events[-1]["data"]) == {"job_id": job_id, "status": "succeeded"}

    resumed = client.get(
        f"/v1/jobs/{job_id}/events",
        headers={**tenant.headers, "Accept": "text/event-stream", "Last-Event-ID": "2"},
    )
    assert [e["event"] for e in sse_events(resumed.text)] == ["job.succeeded", "end"]


def test_metrics_history_as_json_and_csv_one_row_per_step(
    client: TestClient, tenant: TenantKey, db: Database
) -> None:
    job_id = create_job(client, tenant.headers)
    worker = FakeWorker(db, job_id)
    worker.steps(1, 4, entropy=0.5)
    worker.steps(3, 4, entropy=0.7)  # steps redone after a resume: one row each, the last values win
    with db.transaction() as session:
        assert repository.record_step_metrics(
            session, job_id, worker.token, 5, {"entropy/mean": float("nan")}
        )
    history = client.get(f"/v1/jobs/{job_id}/metrics", headers=tenant.headers).json()
    assert [p["step"] for p in history["data"]] == [1, 2, 3, 4, 5]
    assert [p["values"].get("entropy/mean") for p in history["data"]] == [0.5, 0.5, 0.7, 0.7, None]
    assert "reward/accuracy" in history["names"]
    window = client.get(
        f"/v1/jobs/{job_id}/metrics",
        params={"since_step": 2, "until_step": 3, "names": "entropy/mean"},
        headers=tenant.headers,
    ).json()
    assert window["data"] == [
        {"step": 2, "values": {"entropy/mean": 0.5}},
        {"step": 3, "values": {"entropy/mean": 0.7}},
    ]

    response = client.get(f"/v1/jobs/{job_id}/metrics", params={"format": "csv"}, headers=tenant.headers)
    assert response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert [r["step"] for r in rows] == ["1", "2", "3", "4", "5"]
    assert float(rows[2]["entropy/mean"]) == pytest.approx(0.7) and rows[4]["entropy/mean"] == ""
    as_accept = client.get(f"/v1/jobs/{job_id}/metrics", headers={**tenant.headers, "Accept": "text/csv"})
    assert as_accept.text == response.text
