"""bench/make_config_model.py: a Llama-shaped model from a config, random weights from a seed, SmolLM2's
tokenizer, as a local HF folder the trainer loads; its size (the script's count, the estimate's shape) agree,
and --parameters picks the number of layers closest to the target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.make_config_model import layers_for, shape_config
from contract.catalog import model_shape_from_config

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--layers", "2", "--hidden", "64", "--intermediate", "256", "--heads", "4", "--kv-heads", "2"]


def test_parameters_pick_the_closest_number_of_layers() -> None:
    width = {"hidden": 2048, "intermediate": 5632, "heads": 32, "kv_heads": 8}

    def total(layers: int) -> int:
        return model_shape_from_config(shape_config(layers=layers, **width)).parameters

    layers = layers_for(1.2e9, **width)
    assert layers == 24 and total(24) == 1_182_894_080
    assert abs(total(layers) - 1.2e9) < min(abs(total(layers - 1) - 1.2e9), abs(total(layers + 1) - 1.2e9))
    assert layers_for(1.0, **width) == 1  # never fewer than one layer


def _make(out: Path, *extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "make_config_model.py"), str(out), *SMALL, *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


@pytest.mark.slow
def test_the_folder_is_a_random_llama_with_smollm2s_tokenizer_that_the_trainer_loads(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from trainer.models import SMOLLM2_135M_INSTRUCT, load_model_and_tokenizer

    printed = _make(tmp_path / "a")
    _make(tmp_path / "b")  # the same seed
    _make(tmp_path / "c", "--seed", "1")
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 2
    assert printed["parameters"] == model_shape_from_config(config).parameters == 3_268_928
    assert printed["config"] == {k: config[k] for k in printed["config"]}

    model, tokenizer = load_model_and_tokenizer(str(tmp_path / "a"))
    assert sum(p.numel() for p in model.parameters()) == printed["parameters"]
    _, smollm2 = load_model_and_tokenizer(SMOLLM2_135M_INSTRUCT)
    text = "Solve 12*34 and think step by step: 408."
    assert tokenizer(text)["input_ids"] == smollm2(text)["input_ids"]
    assert tokenizer.eos_token_id == smollm2.eos_token_id
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], 49_152) and bool(torch.isfinite(logits).all())

    weights = {name: load_file(str(tmp_path / name / "model.safetensors")) for name in "abc"}
    assert weights["a"].keys() == weights["b"].keys() == weights["c"].keys()
    assert all(torch.equal(t, weights["b"][k]) for k, t in weights["a"].items())  # a seed is its weights
    assert not torch.equal(
        weights["a"]["model.embed_tokens.weight"], weights["c"]["model.embed_tokens.weight"]
    )
