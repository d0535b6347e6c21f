"""A tool-use job's limits are checked against the operator's (STARE_TOOL_MAX_*): above them, estimate and
create answer 422 naming the dotted field; within them, the job is created and its spec keeps the limits."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from fastapi.testclient import TestClient

from tests.service.conftest import TenantKey

SPEC_FILE = Path(__file__).resolve().parents[2] / "trainer" / "specs" / "tool_use_tiny.yaml"


def _tool_spec(**limits: Any) -> dict[str, Any]:
    spec = yaml.safe_load(SPEC_FILE.read_text())
    spec = copy.deepcopy(spec)
    spec["environment"]["limits"].update(limits)
    return spec


def test_tool_limits_above_the_operators_are_refused_naming_the_field(
    make_client: Callable[..., TestClient], tenant: TenantKey
) -> None:
    client = make_client(
        tool_max_cpu_seconds=2.0,
        tool_max_wall_seconds=3.0,
        tool_max_memory_mb=300,
        tool_max_processes=4,
        tool_max_output_bytes=1000,
        tool_max_turns=3,
    )
    over = {
        "cpu_seconds": ("limits.cpu_seconds", 2.5),
        "wall_seconds": ("limits.wall_seconds", 3.5),
        "memory_mb": ("limits.memory_mb", 301),
        "processes": ("limits.processes", 5),
        "output_bytes": ("limits.output_bytes", 1001),
    }
    for name, (field, value) in over.items():
        spec = _tool_spec(wall_seconds=3.0, processes=4, output_bytes=1000)
        spec["environment"]["limits"][name] = value
        if name == "cpu_seconds":
            spec["environment"]["limits"]["wall_seconds"] = 2.5  # wall ≥ cpu, within the operator's 3
        for url in ("/v1/jobs/estimate", "/v1/jobs"):
            response = client.post(url, json={"spec": spec}, headers=tenant.headers)
            assert response.status_code == 422, (name, response.text)
            error = response.json()["error"]
            assert error["param"] == f"spec.environment.{field}", error
            assert error["code"] == "exceeds_limit"
            assert f"STARE_TOOL_MAX_{name.upper()}" in error["message"]
    spec = _tool_spec(processes=4, output_bytes=1000)
    spec["environment"]["max_turns"] = 4
    error = client.post("/v1/jobs", json={"spec": spec}, headers=tenant.headers).json()["error"]
    assert error["param"] == "spec.environment.max_turns"

    # Within the operator's limits: created, and the limits are the job's.
    ok = _tool_spec(processes=4, output_bytes=1000)
    response = client.post("/v1/jobs", json={"spec": ok}, headers=tenant.headers)
    assert response.status_code in (200, 201), response.text
    job = response.json()
    assert job["spec"]["environment"]["limits"]["processes"] == 4
    assert job["spec"]["environment"]["tools"] == ["calculator"]


def test_malformed_environment_fields_are_422_with_the_dotted_field(
    client: TestClient, tenant: TenantKey
) -> None:
    cases = [
        ({"tools": ["calculator", "shell"]}, "spec.environment.tools[1]"),
        ({"tools": ["python", "python"]}, "spec.environment.tools"),
        ({"max_turns": 0}, "spec.environment.max_turns"),
        ({"limits": {"cpu_seconds": -1}}, "spec.environment.limits.cpu_seconds"),
        ({"limits": {"wall_seconds": 1, "cpu_seconds": 2}}, "spec.environment.limits.wall_seconds"),
        ({"limits": {"network": True}}, "spec.environment.limits.network"),
        ({"name": "browser"}, "spec.environment.name"),
    ]
    for patch, param in cases:
        spec = _tool_spec()
        env = spec["environment"]
        for key, value in patch.items():
            if key == "limits":
                env["limits"] = value
            else:
                env[key] = value
        response = client.post("/v1/jobs/estimate", json={"spec": spec}, headers=tenant.headers)
        assert response.status_code == 422, (patch, response.text)
        assert response.json()["error"]["param"] == param, (patch, response.json())
