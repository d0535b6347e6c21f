"""A tool-use job (trainer/specs/tool_use_tiny.yaml) submitted over HTTP to the embedded stack runs in the
worker exactly as in the engine alone: it succeeds, and its per-step history carries every tool/* metric
with no token mismatch."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from contract.metrics import CATALOGUE
from worker.embedded import embedded_stack, run_job_over_http

SPEC = Path(__file__).resolve().parents[2] / "trainer" / "specs" / "tool_use_tiny.yaml"


@pytest.mark.slow
def test_a_tool_use_job_succeeds_over_http(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STARE_DATABASE_URL", raising=False)
    spec = yaml.safe_load(SPEC.read_text())
    spec["optim"]["steps"] = 2
    home = tmp_path / "home"
    with embedded_stack(home) as (base, key):
        job = run_job_over_http(base, key, spec, home / "out", timeout_s=300)
        assert job["status"] == "succeeded", job
        assert job["spec"]["environment"]["tools"] == ["calculator"]
        headers = {"Authorization": f"Bearer {key}"}
        rows = httpx.get(f"{base}/v1/jobs/{job['id']}/metrics", headers=headers, timeout=10).json()["data"]
    assert [row["step"] for row in rows] == [1, 2]
    tool_keys = {m.key for m in CATALOGUE if m.key.startswith("tool/")}
    for row in rows:
        values = row["values"]
        assert tool_keys <= set(values), tool_keys - set(values)
        assert values["tool/token_mismatches"] == 0.0
        assert values["tool/calls_per_response"] > 0.0
