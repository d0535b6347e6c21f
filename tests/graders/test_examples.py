"""examples/graders: grader.json and spec.yaml carry numeric_grader.py as written, the spec loads (with the
uploaded file's path filled in), and the grader scores the sample rows as the built-in numeric verifier
does, in the sandbox."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from contract.graders import GraderLimitsSpec, parse_grader
from contract.spec import TrainSpec
from trainer.graders.grading import Grader
from trainer.tasks import verifiers
from trainer.tasks.sources import Example, load_jsonl

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "graders"


def test_the_grader_json_and_the_spec_carry_the_grader_source_as_written() -> None:
    source = (EXAMPLES / "numeric_grader.py").read_text()
    assert json.loads((EXAMPLES / "grader.json").read_text())["source"] == source
    data = yaml.safe_load((EXAMPLES / "spec.yaml").read_text())
    data["task"]["path"] = str(EXAMPLES / "rows.jsonl")
    spec = TrainSpec.model_validate(data)
    assert spec.grader is not None and spec.grader.type == "python" and spec.grader.source == source
    assert len(load_jsonl(EXAMPLES / "rows.jsonl")) == 64


def test_the_example_grader_scores_the_samples_as_the_numeric_verifier(grader_environment: None) -> None:
    rows = [json.loads(line) for line in (EXAMPLES / "samples.jsonl").read_text().splitlines()]
    grader = Grader.start(
        parse_grader(json.loads((EXAMPLES / "grader.json").read_text())), GraderLimitsSpec(timeout_s=20), 1
    )
    try:
        outcomes = grader.grade([r["sample"]["output_text"] for r in rows], [r["item"] for r in rows])
    finally:
        grader.close()
    expected = [
        verifiers.score(
            "numeric", r["sample"]["output_text"], Example(r["item"]["prompt"], r["item"]["answer"])
        )
        for r in rows
    ]
    assert [o.score for o in outcomes] == expected
    assert expected == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]


def test_the_docs_list_exactly_the_grader_environments_packages() -> None:
    docs = (EXAMPLES.parents[1] / "docs" / "GRADERS.md").read_text()
    pins = [
        line
        for line in (EXAMPLES.parents[1] / "scripts" / "grader-requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    table = dict(re.findall(r"^\| ([a-z0-9-]+) \| ([0-9.]+) \|$", docs, re.MULTILINE))
    listed = set(re.findall(r"`([A-Za-z0-9_.-]+==[0-9.a-z]+)`", docs))
    for pin in pins:
        name, version = pin.split("==")
        in_table = table.get(name.lower().replace("_", "-")) == version
        assert in_table or pin in listed, pin
    assert len(table) + len(listed) == len(pins)
