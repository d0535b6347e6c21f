"""`stare jobs validate SPEC [--training-file F]` against the real service (tests/client/stack.py): every
problem of a spec or of its training file with its path, exit 1; a valid job's estimate, exit 0
(issue 46, item 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from stare_client.cli import Exit, main
from tests.client.stack import Stack, tiny_spec

pytestmark = pytest.mark.slow


@pytest.fixture
def connected(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Stack:
    monkeypatch.setenv("STARE_API_URL", stack.url)
    monkeypatch.setenv("STARE_API_KEY", stack.api_key)
    return stack


def spec_file(tmp_path: Path, spec: dict[str, Any]) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["jobs", "validate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_valid_spec_prints_its_estimate_and_exits_0(
    connected: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = spec_file(tmp_path, tiny_spec(3))
    code, out, err = run(capsys, path)
    assert code == Exit.OK, (out, err)
    assert out.startswith("valid: 3 steps") and "queue" in out
    code, out, _ = run(capsys, path, "-o", "json")
    assert code == Exit.OK and json.loads(out)["total_steps"] == 3


def test_every_mistake_is_printed_with_its_path_and_exits_1(
    connected: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tiny_spec(3)
    spec["optim"] = {"steps": 3, "learning_rate": 1e-3}
    spec["evaluation"] = {"k": 2}
    spec["algorithm"] = {"name": "grop"}
    spec["sampling"] = {"group_size": "eight"}
    path = spec_file(tmp_path, spec)
    code, out, err = run(capsys, path)
    assert code == Exit.ERROR, (out, err)
    lines = out.splitlines()
    assert lines[0] == "invalid: 4 problems"
    fields = {line.strip().split(":", 1)[0] for line in lines[1:]}
    assert fields == {"optim.learning_rate", "evaluation.k", "algorithm.name", "sampling.group_size"}
    assert "optim.learning_rate: unknown field; did you mean `lr`?" in out
    code, out, _ = run(capsys, path, "-o", "json")
    body = json.loads(out)
    assert code == Exit.ERROR and body["valid"] is False and body["code"] == "invalid_spec"
    assert {p["field"] for p in body["problems"]} == fields


def test_a_local_training_file_is_uploaded_and_its_lines_checked(
    connected: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tiny_spec(2)
    spec["task"] = {"source": "jsonl", "train_size": 0, "eval_size": 2}
    path = spec_file(tmp_path, spec)
    data = tmp_path / "numbers.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1=", "answer": i + 1}) + "\n" for i in range(30)))
    code, out, err = run(capsys, path, "--training-file", str(data))
    assert code == Exit.ERROR, (out, err)
    assert "line 1 (question): unknown key `question`; did you mean `prompt`?" in out
    assert "line 1 (answer): answer must be a string, not a number: quote it" in out

    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(30))
    )
    code, out, err = run(capsys, path, "--training-file", str(data))
    assert code == Exit.OK, (out, err)
    assert out.startswith("valid: 2 steps")
    assert "uploaded" in err and "--training-file file_" in err
