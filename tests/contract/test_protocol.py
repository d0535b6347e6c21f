"""The trainer process's protocol (contract.protocol): exit codes, event lines, checkpoint folder names,
as the trainer writes them and the worker reads them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contract import protocol
from contract.protocol import EVENT_FIELDS, EventType, ExitCode
from contract.storage import STORAGE_CODES, StorageError

ROOT = Path(__file__).resolve().parents[2]


def test_exit_codes_are_the_documented_numbers() -> None:
    assert {code.name: int(code) for code in ExitCode} == {
        "OK": 0,
        "FAILED": 1,
        "USER_ERROR": 2,
        "NON_FINITE": 3,
        "GRADER_FAILED": 4,
        "STORAGE": 74,
        "INTERRUPTED": 75,
        "CLUSTER_UNAVAILABLE": 69,
        "WORKER_LOST": 76,
    }


def test_every_event_type_has_its_fields() -> None:
    assert set(EVENT_FIELDS) == set(EventType)
    for fields in EVENT_FIELDS.values():
        assert fields.required and fields.doc
        assert not set(fields.required) & set(fields.optional)


def test_an_event_line_round_trips() -> None:
    event = {"type": "step", "time": "2026-01-01T00:00:00+00:00", "step": 3, "metrics": {"entropy/mean": 0.4}}
    line = protocol.format_event_line(event)
    assert line.startswith("@@event ") and "\n" not in line
    assert protocol.parse_event_line(line) == event


@pytest.mark.parametrize(
    "line", ["", "step 3", "@@event ", "@@event {not json", "@@event [1, 2]", 'event {"type": "step"}']
)
def test_a_line_that_is_not_an_event_is_not_one(line: str) -> None:
    assert protocol.parse_event_line(line) is None


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({"type": "stepped", "step": 1}, "unknown event type 'stepped'"),
        ({"step": 1}, "unknown event type None"),
        ({"type": "checkpoint", "step": 1}, "checkpoint event without path"),
        ({"type": "checkpoint_deleted", "step": 1, "path": "x"}, "unknown field"),
    ],
)
def test_a_malformed_event_is_refused_by_name(event: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        protocol.format_event_line(event)


def test_a_storage_error_event_follows_the_protocol() -> None:
    event = StorageError(28, "/runs/x/events.jsonl").event(step=4)
    assert protocol.check_event(event) is event
    assert event["code"] in STORAGE_CODES and event["code"] in set(protocol.ErrorCode)
    assert event["errno"] == "ENOSPC"


@pytest.mark.parametrize(
    ("step", "name"), [(0, "step-000000"), (50, "step-000050"), (1234567, "step-1234567")]
)
def test_checkpoint_names_round_trip(step: int, name: str) -> None:
    assert protocol.checkpoint_name(step) == name
    assert protocol.checkpoint_step(name) == step


@pytest.mark.parametrize(
    "name", ["step-", "step-12a", "step--1", "step-+5", "step- 5", ".tmp-step-000050-9", "model"]
)
def test_other_folder_names_are_no_checkpoints(name: str) -> None:
    assert protocol.checkpoint_step(name) is None


@pytest.mark.parametrize("step", [-1, 1.5, True, "3"])
def test_a_checkpoint_step_must_be_a_non_negative_integer(step: object) -> None:
    with pytest.raises(ValueError, match="non-negative integer"):
        protocol.checkpoint_name(step)  # type: ignore[arg-type]


def test_the_trainer_and_the_worker_read_checkpoint_folders_alike(tmp_path: Path) -> None:
    from trainer import checkpoints

    for step in (0, 5, 12):
        folder = checkpoints.checkpoint_dir(tmp_path, step)
        folder.mkdir()
        (folder / "state.json").write_text(json.dumps({"step": step}))
    (tmp_path / "step-junk").mkdir()
    (tmp_path / ".tmp-step-000020-1").mkdir()
    assert [step for step, _ in checkpoints.list_checkpoints(tmp_path)] == [0, 5, 12]
    assert sorted(p.name for p in tmp_path.glob(protocol.CHECKPOINT_GLOB)) == [
        "step-000000",
        "step-000005",
        "step-000012",
        "step-junk",
    ]


def test_the_trainer_exits_with_the_user_error_code_on_a_bad_spec(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("optim: {lr: -1}\n")
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "validate", str(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == ExitCode.USER_ERROR, result.stderr
    assert "optim.lr" in result.stderr
