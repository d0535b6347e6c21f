"""A sampling failure the spec causes is the trainer's user error (exit 2, the job fails `invalid_job`), not a
crash the worker retries into a crash loop (issue 32, N9): a temperature below contract.spec.MIN_TEMPERATURE
is refused when the spec is loaded, and probabilities torch cannot sample from end the run as a
SamplingError (a ValueError) naming the sampling settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import transformers
import yaml

from contract.protocol import ExitCode
from trainer.launch.cli import main
from trainer.models import build_tiny_arith
from trainer.rollout.generation import HFGenerate, SamplingError

SPEC: dict[str, Any] = {
    "model": {"name": "tiny-arith"},
    "task": {"source": "arithmetic", "train_size": 16, "eval_size": 2},
    "sampling": {"group_size": 2, "max_new_tokens": 3},
    "optim": {"steps": 1, "prompts_per_step": 2, "micro_batch_size": 4},
    "evaluation": {"interval": 0},
}


def test_unsampleable_probabilities_are_a_sampling_error() -> None:
    model, tokenizer = build_tiny_arith()
    enc = tokenizer(["1+2="], return_tensors="pt")
    with pytest.raises(SamplingError, match=r"temperature 1e-300.*sampling\.temperature") as caught:
        HFGenerate(model, tokenizer).sample(
            enc["input_ids"],
            enc["attention_mask"],
            num_samples=2,
            temperature=1e-300,
            top_p=1.0,
            max_new_tokens=3,
        )
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("where", ["sampling", "evaluation"])
def test_a_temperature_below_the_bound_is_refused_at_load_with_exit_2(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = {**SPEC, where: {**SPEC.get(where, {}), "temperature": 1e-300}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == ExitCode.USER_ERROR
    assert f"{where}.temperature" in capsys.readouterr().err


def test_a_sampling_failure_during_the_run_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")

    monkeypatch.setattr(transformers.GenerationMixin, "generate", refuse)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == ExitCode.USER_ERROR
    assert "check sampling.temperature and sampling.top_p" in capsys.readouterr().err
