"""`stare jobs get` shows the PI entropy law's line (law, target, u, e, I, actuator, saturation) for a job
that has one, and no controller row for a job without (the job view's `control`)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from stare_client import models
from stare_client.cli import Exit, main
from stare_client.cli import jobs as cli_jobs

NOW = "2026-12-03T22:00:00Z"
CONTROL = {
    "law": "stare_pi",
    "target": 0.6,
    "output": 1.0,
    "error": 0.35,
    "integral": 12.5,
    "actuator": 10.0,
    "at_clip": True,
    "saturated_steps": 23,
    "saturated": True,
}


def _job(control: dict[str, Any] | None) -> models.Job:
    return models.Job.model_validate(
        {
            "id": "job_0000000000000000000000001",
            "name": "held",
            "status": "running",
            "model": "smollm2-135m-instruct",
            "algorithm": "stare_pi" if control else "grpo_ds",
            "queue": "training",
            "training_file": None,
            "metadata": {},
            "created_at": NOW,
            "updated_at": NOW,
            "started_at": NOW,
            "finished_at": None,
            "attempt": 1,
            "max_attempts": 3,
            "failures": 0,
            "lost_workers": 0,
            "max_lost_workers": 3,
            "progress": {
                "step": 30,
                "total_steps": 100,
                "fraction": 0.3,
                "step_seconds": None,
                "eta_seconds": None,
                "estimated_finish": None,
            },
            "entropy": {
                "value": 0.39,
                "band": {"low": None, "high": None},
                "state": None,
                "steps_out_of_band": None,
            },
            "control": control,
            "latest_metrics": None,
            "error": None,
            "spec": {},
        }
    )


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Console, list[models.Job]]]:
    """`stare jobs get` against a stand-in client that returns the job put in the list; the output recorded."""
    console = Console(record=True, width=240, highlight=False)
    served: list[models.Job] = []

    @contextlib.contextmanager
    def fake_client() -> Iterator[Any]:
        yield SimpleNamespace(jobs=SimpleNamespace(get=lambda job_id: served[0]))

    monkeypatch.setattr(cli_jobs, "client", fake_client)
    monkeypatch.setattr(cli_jobs, "out", console)
    yield console, served


def test_jobs_get_shows_the_controller_and_its_saturation(shown: tuple[Console, list[models.Job]]) -> None:
    console, served = shown
    served.append(_job(CONTROL))
    assert main(["jobs", "get", "job_0000000000000000000000001"]) == Exit.OK
    text = console.export_text()
    line = next(row for row in text.splitlines() if row.lstrip().startswith("controller"))
    for part in ("stare_pi", "target 0.600", "u 1.000", "e 0.350", "I 12.500", "actuator 10.000"):
        assert part in line, (part, line)
    assert "at its clip 23 steps" in line and "saturated: the target cannot be held" in line


def test_jobs_get_without_saturation_and_without_a_controller(
    shown: tuple[Console, list[models.Job]],
) -> None:
    console, served = shown
    served.append(
        _job({**CONTROL, "output": 0.4, "at_clip": False, "saturated_steps": 0, "saturated": False})
    )
    assert main(["jobs", "get", "job_0000000000000000000000001"]) == Exit.OK
    text = console.export_text()
    assert "u 0.400" in text and "at its clip" not in text and "saturated" not in text
    served[0] = _job(None)
    assert main(["jobs", "get", "job_0000000000000000000000001"]) == Exit.OK
    assert "controller" not in console.export_text()


def test_jobs_get_json_carries_the_control_block(
    shown: tuple[Console, list[models.Job]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, served = shown
    served.append(_job(CONTROL))
    assert main(["jobs", "get", "job_0000000000000000000000001", "-o", "json"]) == Exit.OK
    assert json.loads(capsys.readouterr().out)["control"] == CONTROL
