"""The noise floor of the batch entropy (experiments/noise_floor.py) on the tiny model: N fresh step batches of
one fixed policy, their H̄ spread reported by contract.stability.noise_floor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from experiments import noise_floor
from tests.trainer.test_engine import small_spec


def test_the_noise_floor_resamples_one_fixed_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(small_spec(algorithm={"name": "grpo_ds"})))
    assert noise_floor.main([str(spec), "--samples", "3", "--out", str(tmp_path / "run")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["samples"] == 3 and result["batch"] == 12
    assert result["mean"] > 0 and result["sd"] > 0  # other prompts and samples each time: H̄ differs
    assert result["relative_sd"] == pytest.approx(result["sd"] / result["mean"])
    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        (tmp_path / "run" / "checkpoints").iterdir()
    )


def test_fewer_than_two_samples_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        noise_floor.main([str(tmp_path / "spec.yaml"), "--samples", "1"])
