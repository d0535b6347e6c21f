"""trainer/distributed/hf_folder.py: full weights written as they come, into a folder transformers loads.

The writer must never hold more than one file's tensors beside the model (the export of a sharded model on
rank 0 and the folder vLLM is built from both rely on it), lay the files out as transformers does, name the
weights' dtype in the config, leave out a tied LM head, and a LoRA policy's export is its merged model.
(The sharded, collective side runs in tests/trainer/test_fsdp2.py and test_fsdp2_engine.py: each rank's
exported folder there gives the trainer's logits.)"""

from __future__ import annotations

import copy
import json
import weakref
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from contract.distributed import DistributedSpec
from contract.storage import StorageError
from tests.trainer.test_strategy import _lora_model
from trainer.distributed import Runtime, checkpoint
from trainer.distributed.hf_folder import INDEX_FILE, SINGLE_FILE, write_folder, write_weights
from trainer.distributed.strategy import full_state
from trainer.models import build_tiny_arith

IDS = torch.tensor([[1, 5, 6, 7, 8, 9, 10]])


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(input_ids=IDS).logits


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def test_files_hold_at_most_their_cap_and_the_folder_loads_with_the_same_logits(tmp_path: Path) -> None:
    model, tokenizer = build_tiny_arith(seed=3)
    sizes, held, given = [], [], []

    def tracked():
        for name, tensor in full_state(model):
            value = tensor.clone()
            held.append(sum(_nbytes(ref()) for ref in given[:-1]))  # what the writer still keeps alive
            given.append(weakref.ref(value))
            sizes.append(_nbytes(value))
            yield name, value

    file_bytes = 600_000
    total = write_folder(tracked(), tmp_path, config=model.config, tokenizer=tokenizer, file_bytes=file_bytes)
    assert total == sum(sizes) and max(held) <= file_bytes < total - max(sizes)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 2 and files[-1] == f"model-{len(files):05d}-of-{len(files):05d}.safetensors"
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == files
    assert index["metadata"]["total_size"] == total
    assert "lm_head.weight" not in index["weight_map"]  # tied to the embeddings
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.dtype == torch.float32
    assert torch.equal(_logits(loaded), _logits(model))


def test_one_file_is_model_safetensors_and_the_config_names_the_weights_dtype(tmp_path: Path) -> None:
    model, _ = build_tiny_arith(seed=4)
    half = copy.deepcopy(model).to(torch.bfloat16)
    half.config.dtype = "float32"  # what the config said before the cast: the writer must correct it
    write_folder(full_state(half), tmp_path, config=half.config)
    assert [p.name for p in tmp_path.glob("*.safetensors")] == [SINGLE_FILE]
    assert not (tmp_path / INDEX_FILE).exists()
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    assert half.config.dtype == "float32"  # the live model's config is left alone
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype="auto")
    assert loaded.dtype == torch.bfloat16
    # (Weights, not logits: a bf16 model built by from_pretrained keeps its rotary inv_freq buffer in
    # float32, one cast by .to() does not, and the logits differ by that rounding.)
    expected = half.state_dict()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in loaded.state_dict().items())


def test_a_process_that_does_not_write_drains_the_gathers_and_writes_nothing(tmp_path: Path) -> None:
    drawn = []

    def weights():
        for i in range(3):
            drawn.append(i)
            yield f"w{i}", torch.zeros(4)

    assert write_weights(weights(), tmp_path / "none", write=False) == 0
    assert drawn == [0, 1, 2] and not (tmp_path / "none").exists()


def test_a_live_lora_export_is_the_merged_model_and_a_failed_write_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lora = _lora_model()
    merged = copy.deepcopy(lora).merge_and_unload()
    runtime = Runtime(DistributedSpec(), torch.device("cpu"))
    out = checkpoint.export_hf_folder(lora, tmp_path / "model", runtime=runtime)
    assert out == tmp_path / "model" and not any(out.glob("adapter_*"))
    assert torch.equal(_logits(AutoModelForCausalLM.from_pretrained(out)), _logits(merged))

    def full_disk(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", full_disk)
    with pytest.raises(StorageError) as raised:
        checkpoint.export_hf_folder(lora, tmp_path / "again", runtime=runtime)
    assert raised.value.errno_name == "ENOSPC"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temp folder, no half folder
