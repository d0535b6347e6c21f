"""The job view's `control` block: the PI entropy law's output, error, integral, actuator and saturation from
the latest step's metrics for a job that has a law; null for one that has none."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.page_charts import chart_groups
from store import repository
from store.database import Database
from tests.service.conftest import TenantKey
from tests.service.helpers import TINY_SPEC, FakeWorker, create_job, step_metrics
from tests.service.test_pages import _signed_in

# A target and no algorithm name: the default law (contract/control/__init__.py DEFAULT_LAW).
CONTROL_SPEC: dict[str, Any] = {**TINY_SPEC, "algorithm": {"control": {"target_entropy": 0.5}}}


def _control_metrics(step: int, *, output: float, saturated_steps: int) -> dict[str, float]:
    return {
        **step_metrics(step, 0.4),
        "control/target_entropy": 0.5,
        "control/output": output,
        "control/error": 0.2,
        "control/integral": 1.5 + step,
        "control/actuator": 0.55 * output,
        "control/saturated": 1.0 if abs(output) >= 1.0 else 0.0,
        "control/saturated_steps": float(saturated_steps),
    }


def _record(db: Database, job_id: str, worker: FakeWorker, step: int, metrics: dict[str, float]) -> None:
    with db.transaction() as session:
        assert repository.record_step_metrics(session, job_id, worker.token, step, metrics)


def test_a_job_with_a_pi_law_shows_its_output_error_integral_and_actuator(
    client: TestClient, tenant: TenantKey, db: Database
) -> None:
    job_id = create_job(client, tenant.headers, CONTROL_SPEC)
    job = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()
    assert job["algorithm"] == "entropy_pi"
    # Before the first step: the law is known, its values are not.
    assert job["control"] == {
        "law": "entropy_pi",
        "target": None,
        "output": None,
        "error": None,
        "integral": None,
        "actuator": None,
        "at_clip": None,
        "saturated_steps": None,
        "saturated": False,
    }
    worker = FakeWorker(db, job_id)
    _record(db, job_id, worker, 1, _control_metrics(1, output=0.3, saturated_steps=0))
    _record(db, job_id, worker, 2, _control_metrics(2, output=0.4, saturated_steps=0))
    control = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["control"]
    assert control == {
        "law": "entropy_pi",
        "target": 0.5,
        "output": pytest.approx(0.4),
        "error": pytest.approx(0.2),
        "integral": pytest.approx(3.5),  # the latest step's, not the first's
        "actuator": pytest.approx(0.22),
        "at_clip": False,
        "saturated_steps": 0,
        "saturated": False,
    }
    listed = client.get("/v1/jobs", headers=tenant.headers).json()["data"]
    assert next(j for j in listed if j["id"] == job_id)["control"] == control


def test_saturated_once_the_output_sits_at_its_clip_for_twenty_steps(
    client: TestClient, tenant: TenantKey, db: Database
) -> None:
    job_id = create_job(client, tenant.headers, CONTROL_SPEC)
    worker = FakeWorker(db, job_id)
    _record(db, job_id, worker, 1, _control_metrics(1, output=1.0, saturated_steps=19))
    control = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["control"]
    assert control["at_clip"] is True and control["saturated_steps"] == 19
    assert control["saturated"] is False  # one step short of the alert's 20
    _record(db, job_id, worker, 2, _control_metrics(2, output=1.0, saturated_steps=20))
    control = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["control"]
    assert control["saturated_steps"] == 20 and control["saturated"] is True
    _record(db, job_id, worker, 3, _control_metrics(3, output=0.9, saturated_steps=0))
    control = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["control"]
    assert control["at_clip"] is False and control["saturated"] is False  # off the clip: cleared


def test_at_the_lowering_clip_saturated_takes_fifty_steps(
    client: TestClient, tenant: TenantKey, db: Database
) -> None:
    """u = −u_min while the policy's drift brings entropy down to the target is the approach, not an alarm:
    20 steps there are not saturated, 50 are (contract/control/pi.py)."""
    job_id = create_job(client, tenant.headers, CONTROL_SPEC)
    worker = FakeWorker(db, job_id)
    _record(db, job_id, worker, 1, _control_metrics(1, output=-0.1, saturated_steps=20))
    control = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["control"]
    assert control["saturated_steps"] == 20 and control["saturated"] is False
    _record(db, job_id, worker, 2, _control_metrics(2, output=-0.1, saturated_steps=49))
    assert client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["control"]["saturated"] is False
    _record(db, job_id, worker, 3, _control_metrics(3, output=-0.1, saturated_steps=50))
    assert client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["control"]["saturated"] is True


def test_a_job_without_a_controller_has_no_control_block(
    client: TestClient, tenant: TenantKey, db: Database
) -> None:
    job_id = create_job(client, tenant.headers)
    assert client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()["control"] is None
    worker = FakeWorker(db, job_id)
    worker.steps(1, 3)
    job = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers).json()
    assert job["algorithm"] != "entropy_pi" and job["control"] is None


def test_the_openapi_schema_describes_the_control_block(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    control = schemas["ControlStatus"]
    assert set(control["properties"]) == {
        "law",
        "target",
        "output",
        "error",
        "integral",
        "actuator",
        "at_clip",
        "saturated_steps",
        "saturated",
    }
    assert "control" in schemas["JobObject"]["properties"]
    assert "control" not in schemas["JobObject"].get("required", [])


def _job_data(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="job-data">(.*?)</script>', page, re.DOTALL)
    assert found is not None
    return dict(json.loads(found[1]))


def test_the_live_page_carries_the_control_block_and_its_charts(
    client: TestClient, tenant: TenantKey, db: Database
) -> None:
    job_id = create_job(client, tenant.headers, CONTROL_SPEC)
    worker = FakeWorker(db, job_id)
    _record(db, job_id, worker, 1, _control_metrics(1, output=1.0, saturated_steps=20))
    plain_id = create_job(client, tenant.headers)
    _signed_in(client, tenant.key)
    page = client.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200, page.text
    assert '<span id="control"></span>' in page.text  # job.js fills it from the job view (and the stream)
    control = _job_data(page.text)["control"]
    assert control["law"] == "entropy_pi" and control["saturated"] is True and control["output"] == 1.0
    plain = client.get(f"/ui/jobs/{plain_id}")
    assert _job_data(plain.text)["control"] is None
    groups = {group["id"]: group for group in chart_groups()}
    assert [s["key"] for s in groups["control"]["series"]] == [
        "control/output",
        "control/error",
        "control/integral",
    ]
    assert [s["key"] for s in groups["actuator"]["series"]] == ["control/actuator"]
    assert "control/target_entropy" in {s["key"] for s in groups["entropy"]["series"]}
    # The script renders the block and marks a saturated law (the alert's condition).
    script = client.get("/ui/static/job.js").text
    assert "renderControl(job.control)" in script and "control-saturated" in script
