"""examples/own_data (issue 46, docs/CLIENT.md "Your own data"): the builder writes 200 distinct problems that
the upload check accepts, each answer a quoted number equal to the problem's; the spec is valid for the
service as committed (no task.path) and, with the file's path added, for the engine alone, and holds the
settings the guide explains. Its training run is measured, not tested (minutes of SmolLM2 on a CPU)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from contract.spec import TrainSpec
from trainer.data import load_examples
from trainer.tasks.sources import validate_jsonl_lines

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_data"


def test_the_builder_writes_distinct_problems_the_upload_check_accepts(tmp_path: Path) -> None:
    out = tmp_path / "problems.jsonl"
    subprocess.run([sys.executable, str(EXAMPLE / "make_data.py"), "--out", str(out)], check=True)
    lines = out.read_bytes().splitlines()
    assert len(lines) == 200 and validate_jsonl_lines(lines) == []
    records = [json.loads(line) for line in lines]
    assert len({r["prompt"] for r in records}) == 200
    for r in records:
        assert isinstance(r["answer"], str) and r["answer"].isdigit(), r
        a, b = (int(n) for n in re.findall(r"\d+", r["prompt"])[:2])
        assert int(r["answer"]) in (a + b, a - b), r  # gets/finds/in all: a + b; gives away: a - b

    spec = yaml.safe_load((EXAMPLE / "spec.yaml").read_text())
    assert "path" not in spec["task"]  # the service sets it from --training-file and refuses one
    spec["task"]["path"] = str(out)
    parsed = TrainSpec.model_validate(spec)
    assert parsed.model.name == "smollm2-135m-instruct" and parsed.task.use_chat_template
    assert parsed.verifier.name == "numeric" and parsed.sampling.max_new_tokens == 32
    assert parsed.band_follows_target() and parsed.evaluation.greedy
    train, held_out = load_examples(parsed)
    assert len(held_out) == 50 and len(train.examples) == 150
