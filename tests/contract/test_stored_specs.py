"""Every stored spec validates to the same job as before the controllers were declared in one place (issue 47):
the shipped specs, the results pages' run specs, every run spec of the experiment plan and a set of
algorithm sections in every older shape (STARE's `gate`, adaptive_entropy's `entropy_control` or `gate`, a
PI law's `control` without `controller`). specs_before_control_package.json.gz holds each raw spec and the
job the code before the change read from it: the spec with every default filled in, the algorithm's name,
estimator and loss parameters, its controller and that controller's settings (target as set), and whether
the band follows the target. Specs the earlier code refused are refused still."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from contract.spec import TrainSpec

GOLDEN = Path(__file__).with_name("specs_before_control_package.json.gz")
ROWS: list[dict[str, Any]] = json.loads(gzip.decompress(GOLDEN.read_bytes()))


def canonical(spec: TrainSpec) -> dict[str, Any]:
    data = spec.resolved()
    algorithm = data.pop("algorithm")
    control = spec.algorithm.control
    return {
        "rest": data,
        "algorithm": {k: algorithm[k] for k in ("name", "advantage", "params")},
        "control": None if control is None else control.model_dump(mode="json"),
        "band_follows_target": spec.band_follows_target(),
    }


def test_the_golden_file_covers_every_shape() -> None:
    sources = {row["source"].split(":")[0].split("/")[0] for row in ROWS}
    assert {"trainer", "results", "plan", "case"} <= sources
    controllers = {(row["canonical"].get("control") or {}).get("controller") for row in ROWS}
    assert {None, "stare_gate", "entropy_coef", "entropy_pi", "stare_pi", "clip_pi"} <= controllers
    assert any("refused" in row["canonical"] for row in ROWS)


# Sections the spec gained after the golden file was written: a stored spec leaves them at these values,
# which change nothing of the job it was (a tenant grader replaces the verifier only where one is set).
ADDED_SINCE = {"grader": None, "grading": None}
# Fields added inside a section since: (section, field) → the value a stored spec gets. Which checkpoints keep
# the optimizer state on the server (issue 46) is a storage policy: the training is the same.
ADDED_FIELDS_SINCE = {("checkpoint", "training_state"): "resume"}


@pytest.mark.parametrize("row", ROWS, ids=[row["source"] for row in ROWS])
def test_a_stored_spec_validates_to_the_same_job(row: dict[str, Any]) -> None:
    if "refused" in row["canonical"]:
        with pytest.raises(ValidationError):
            TrainSpec.model_validate(row["spec"])
        return
    now = canonical(TrainSpec.model_validate(row["spec"]))
    added = {k: now["rest"].pop(k) for k in set(now["rest"]) - set(row["canonical"]["rest"])}
    for (section, field), value in ADDED_FIELDS_SINCE.items():
        assert field not in row["canonical"]["rest"][section] and now["rest"][section].pop(field) == value
    assert set(added) <= set(ADDED_SINCE) and all(added[k] == ADDED_SINCE[k] for k in added), added
    assert now == row["canonical"]
