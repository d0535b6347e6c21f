"""client.graders (sync and async, one source) and `stare graders run/validate` against the real service
(tests/client/stack.py), with the example grader of examples/graders in the server's sandbox."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from stare_client import Client, errors
from stare_client.aio import AsyncClient
from tests.client.stack import REPO_ROOT, Stack
from tests.client.test_cli import stare_env
from tests.graders.conftest import grader_environment  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow
EXAMPLES = REPO_ROOT / "examples" / "graders"
GRADER = json.loads((EXAMPLES / "grader.json").read_text())
ROWS = [json.loads(line) for line in (EXAMPLES / "samples.jsonl").read_text().splitlines()]


def test_the_client_runs_and_validates_a_grader_sync_and_async(
    grader_environment: None,  # noqa: F811
    stack: Stack,
    client: Client,
) -> None:
    ran = client.graders.run(GRADER, ROWS)
    assert [r.score for r in ran.results] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert all(r.error is None for r in ran.results) and ran.results[0].passed

    async def validate() -> list[str]:
        async with AsyncClient(stack.url, stack.api_key) as aclient:
            checked = await aclient.graders.validate(GRADER, items=[row["item"] for row in ROWS[:2]])
            return [warning.code for warning in checked.warnings]

    assert asyncio.run(validate()) == []  # the numeric grader passes nothing but a right answer
    with pytest.raises(errors.ValidationError) as refused:
        client.graders.validate({"type": "python", "source": "def grade(sample):\n    return 1\n"})
    assert refused.value.param == "grader.source"


def test_stare_graders_run_prints_each_row_and_the_warnings(
    grader_environment: None,  # noqa: F811
    stack: Stack,
    tmp_path: Path,
) -> None:
    loose = tmp_path / "loose.json"
    loose.write_text(
        json.dumps(
            {
                "type": "string_check",
                "input": "{{item.answer}}",
                "reference": "{{sample.output_text}}",
                "operation": "like",
            }
        )
    )
    cmd = [
        sys.executable,
        "-m",
        "stare_client.cli",
        "graders",
        "run",
        str(loose),
        "--data",
        str(EXAMPLES / "samples.jsonl"),
    ]
    done = subprocess.run(cmd, env=stare_env(stack), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "scores 1 for an empty output" in done.stdout
    as_json = subprocess.run(
        [*cmd, "-o", "json"], env=stare_env(stack), capture_output=True, text=True, timeout=300
    )
    assert as_json.returncode == 0, as_json.stderr
    assert len(json.loads(as_json.stdout)["results"]) == len(ROWS)
