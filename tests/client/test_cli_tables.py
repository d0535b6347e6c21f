"""`stare jobs list` and `stare jobs compare` at 80 columns: job ids are never cut, and avg@k / pass@k carry
their k (issue 46, item 6). Rendered from a stand-in client, as tests/client/test_cli_control.py does."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from stare_client import models
from stare_client.cli import Exit, main
from stare_client.cli import jobs as cli_jobs
from tests.client.test_cli_control import _job

IDS = ["job_01M98D6MS1Z0D30RHTHVS6J9GB", "job_01M98D6MS1Z0D30RHTHVS6J9GC", "job_01M98D6MS1Z0D30RHTHVS6J9GD"]


def _report(k: int) -> models.Report:
    return models.Report.model_validate(
        {
            "report_version": 1,
            "job": {"duration_s": 41.0},
            "evaluation": {
                "k": k,
                "before": {"step": 0, "avg_at_k": 0.125, "pass_at_k": 0.25, "k": k},
                "after": {"step": 8, "avg_at_k": 0.5, "pass_at_k": 0.75, "k": k},
                "delta": {"avg_at_k": 0.375},
            },
        }
    )


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Console, dict[str, int]]]:
    """A stand-in client serving a job per id in IDS with the report of its k; the output recorded at 80
    columns."""
    console = Console(record=True, width=80, highlight=False)
    ks: dict[str, int] = {}

    def job(job_id: str) -> models.Job:
        return _job(None).model_copy(update={"id": job_id, "status": "succeeded"})

    @contextlib.contextmanager
    def fake_client() -> Iterator[Any]:
        yield SimpleNamespace(
            jobs=SimpleNamespace(get=job, list=lambda **_: [job(i) for i in IDS]),
            reports=SimpleNamespace(get=lambda job_id: _report(ks[job_id])),
        )

    monkeypatch.setattr(cli_jobs, "client", fake_client)
    monkeypatch.setattr(cli_jobs, "out", console)
    yield console, ks


def test_jobs_list_at_80_columns_shows_every_id_whole(served: tuple[Console, dict[str, int]]) -> None:
    console, _ = served
    assert main(["jobs", "list"]) == Exit.OK
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for job_id in IDS:
        assert job_id in text, text
    assert "…" not in text


def test_compare_labels_avg_at_k_with_its_k_and_keeps_the_ids_whole(
    served: tuple[Console, dict[str, int]],
) -> None:
    console, ks = served
    ks.update({IDS[0]: 2, IDS[1]: 2})
    assert main(["jobs", "compare", IDS[0], IDS[1]]) == Exit.OK
    text = console.export_text(clear=True)
    assert "avg@2 before" in text and "pass@2 after" in text and "avg@k" not in text
    for job_id in IDS[:2]:
        assert job_id in text, text

    ks[IDS[2]] = 4  # three jobs do not fit as headers: a legend names each column's job in full
    assert main(["jobs", "compare", *IDS]) == Exit.OK
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for number, job_id in enumerate(IDS, start=1):
        assert f"#{number}  {job_id}" in text, text
    row = next(line for line in text.splitlines() if "avg@k after" in line)
    assert "0.500 (@2)" in row and "0.500 (@4)" in row  # several k: each value says its own


@pytest.mark.parametrize("width", [80, 120])
def test_the_watch_bar_fits_its_terminal_with_step_eta_and_entropy_whole(width: int) -> None:
    """`stare jobs watch` (issue 46, item 6): at 80 columns the bar drops the gate and the reward and
    shortens, so status, step, ETA and entropy with its band fit whole; at 120 it shows all of them."""
    from rich.progress import Progress

    console = Console(record=True, width=width, highlight=False)
    progress = Progress(*cli_jobs.watch_columns(width), console=console, auto_refresh=False)
    task = progress.add_task("job", total=500, completed=250)
    fields = {
        "status": "running",
        "steps": "step 250/500",
        "eta": "eta 12:34",
        "entropy": "0.177 in_band [0.10, 1.00]",
        "gate": "gate on",
        "reward": "reward 0.85",
    }
    progress.update(task, **fields)
    console.print(progress.make_tasks_table(progress.tasks))
    lines = [line for line in console.export_text().splitlines() if line.strip()]
    assert len(lines) == 1 and len(lines[0]) <= width, lines
    for key in ("status", "steps", "eta", "entropy"):
        assert fields[key] in lines[0], (key, lines)
    assert ("gate on" in lines[0] and "reward 0.85" in lines[0]) is (width >= cli_jobs.WIDE_WATCH), lines
