"""The rollout mismatch metrics and the truncated importance-sampling correction (trainer.rollout.mismatch), on
hand-computed values; no vLLM needed. The weight push's iterator (trainer.distributed.strategy.full_state):
LoRA layers come out merged, under the base model's names. The folder vLLM is first built from
(trainer.rollout.vllm_engine._save_policy), written from an fsdp2 policy's shards tensor by tensor."""

from __future__ import annotations

import json
import math
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from contract.hyperparams import ClipLossParams
from contract.spec import TrainSpec
from trainer.algos import compute_policy_loss, make_loss_params
from trainer.algos.aggregation import aggregate
from trainer.algos.surrogate import PolicyLossInputs, clipped_surrogate
from trainer.distributed.strategy import full_state
from trainer.models import apply_lora, build_tiny_arith
from trainer.rollout.mismatch import (
    mismatch_metrics,
    sampler_entropy_gap,
    truncated_is_weights,
    weighted_advantages,
)


def _identity_reduce(values: list[float], reduction: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def test_weights_are_the_trainer_over_sampler_ratio_capped() -> None:
    trainer = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.2)]])
    sampler = torch.tensor([[math.log(0.25), math.log(0.9), math.log(0.8)]])
    weights = truncated_is_weights(trainer, sampler, cap=1.5)
    # 0.5/0.25 = 2 → capped at 1.5; 0.9/0.9 = 1; 0.2/0.8 = 0.25 (below 1: never raised)
    assert torch.allclose(weights, torch.tensor([[1.5, 1.0, 0.25]]), atol=1e-6)
    huge = truncated_is_weights(torch.tensor([[0.0]]), torch.tensor([[-500.0]]), cap=3.0)
    assert huge.item() == pytest.approx(3.0)  # e^500 would overflow: computed in log space


def test_weighted_advantages_weight_each_tokens_clipped_loss() -> None:
    torch.manual_seed(0)
    logprob = torch.randn(3, 5) * 0.3 - 1.0
    old = logprob + torch.randn(3, 5) * 0.3  # ratios on both sides of the clip range
    advantages = torch.tensor([1.0, -2.0, 0.5])
    weights = torch.rand(3, 5) * 2
    mask = torch.ones(3, 5)
    p = ClipLossParams()
    plain, _, _ = clipped_surrogate(logprob, old, advantages[:, None], mask, p)
    weighted, _, _ = clipped_surrogate(logprob, old, weighted_advantages(advantages, weights), mask, p)
    assert torch.allclose(weighted, weights * plain, atol=1e-6)
    # Through a registered loss: its aggregation of w_t ℓ_t.
    inputs = PolicyLossInputs(
        logprob=logprob, old_logprob=old, advantages=weighted_advantages(advantages, weights),
        response_mask=mask, global_token_count=15.0,
    )  # fmt: skip
    grpo = make_loss_params("grpo")
    loss, _ = compute_policy_loss("grpo", inputs, grpo)
    grpo_plain, _, _ = clipped_surrogate(logprob, old, advantages[:, None], mask, grpo)
    expected = aggregate(weights * grpo_plain, mask, grpo.agg_mode, global_token_count=15.0)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_mismatch_metrics_by_hand() -> None:
    sampler = torch.tensor([[math.log(0.5), math.log(0.4), 0.0]])
    trainer = torch.tensor([[math.log(0.25), math.log(0.4), -7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is past the response: not counted
    metrics = mismatch_metrics(sampler, trainer, mask, _identity_reduce, cap=1.5)
    assert metrics["rollout/mismatch_abs_mean"] == pytest.approx(math.log(2) / 2)
    assert metrics["rollout/mismatch_abs_max"] == pytest.approx(math.log(2))
    # k3 with r = π_t/π_s: token 1 r = 0.5: 0.5 − 1 − log 0.5; token 2 r = 1: 0
    assert metrics["rollout/mismatch_kl"] == pytest.approx((0.5 - 1 + math.log(2)) / 2)
    assert metrics["rollout/tis_weight_mean"] == pytest.approx((0.5 + 1.0) / 2)
    assert metrics["rollout/tis_capped_fraction"] == 0.0
    equal = mismatch_metrics(sampler, sampler, mask, _identity_reduce, cap=None)
    assert equal == {
        "rollout/mismatch_abs_mean": 0.0,
        "rollout/mismatch_abs_max": 0.0,
        "rollout/mismatch_kl": 0.0,
    }


def test_the_sampler_entropy_gap_by_hand() -> None:
    """A separate engine's mean surprisal on its own tokens minus the trainer's H̄ on them, masked tokens out;
    nothing where HF generate sampled (no engine of its own: the trainer's model)."""
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    sampler = torch.tensor([[math.log(0.5), math.log(0.25), -9.0], [math.log(0.125), -9.0, -9.0]])
    trainer_entropy = torch.tensor([[0.5, 1.0, 5.0], [2.0, 5.0, 5.0]])
    vllm = SimpleNamespace(sampler_logprob=sampler, sample_entropy=None, response_mask=mask)
    gap = sampler_entropy_gap(vllm, trainer_entropy, _identity_reduce)
    # surprisals ln 2, 2 ln 2, 3 ln 2 over 3 tokens, minus the trainer's (0.5 + 1 + 2) / 3
    assert gap == {"entropy/sampler_gap": pytest.approx((6 * math.log(2) - 3.5) / 3)}
    hf = SimpleNamespace(sampler_logprob=None, sample_entropy=trainer_entropy * 0.9, response_mask=mask)
    assert sampler_entropy_gap(hf, trainer_entropy, _identity_reduce) == {}


def test_the_spec_offers_the_engine_and_the_cap_with_vllm_only() -> None:
    assert TrainSpec().rollout.engine == "hf" and TrainSpec().rollout.tis_cap is None
    assert TrainSpec.model_validate({"rollout": {"engine": "vllm", "tis_cap": 2.0}}).rollout.tis_cap == 2.0
    with pytest.raises(ValidationError, match="tis_cap"):
        TrainSpec.model_validate({"rollout": {"tis_cap": 2.0}})
    with pytest.raises(ValidationError, match="engine"):
        TrainSpec.model_validate({"rollout": {"engine": "sglang"}})
    # Under either strategy, at any number of processes (each process's engine is fed the full weights).
    for strategy in ("ddp", "fsdp2"):
        distributed = {"strategy": strategy, "processes_per_node": 2}
        spec = TrainSpec.model_validate({"rollout": {"engine": "vllm"}, "distributed": distributed})
        assert (spec.rollout.engine, spec.distributed.strategy) == ("vllm", strategy)
    # LoRA too, with or without a merged model/ in its checkpoints (adapter/ is always there).
    lora = {"name": "tiny-arith", "lora": {"r": 4, "alpha": 8, "merge_on_save": False}}
    spec = TrainSpec.model_validate(
        {"model": lora, "rollout": {"engine": "vllm"}, "distributed": {"strategy": "fsdp2"}}
    )
    assert spec.model.lora is not None and spec.rollout.engine == "vllm"


def test_lora_weights_are_pushed_merged_under_the_base_names() -> None:
    model, _ = build_tiny_arith(0)
    names = {name for name, _ in model.named_parameters()}
    lora = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    for name, param in lora.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)  # a trained adapter: ΔW ≠ 0
    base_q = lora.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight.detach().clone()
    pushed = dict(full_state(lora))
    assert set(pushed) == names
    assert not torch.allclose(pushed["model.layers.0.self_attn.q_proj.weight"], base_q)  # ΔW is in
    merged = lora.merge_and_unload()
    for name, tensor in merged.named_parameters():
        assert torch.allclose(pushed[name], tensor, atol=1e-6), name


def test_the_initial_vllm_folder_is_written_tensor_by_tensor_from_fsdp2_shards(tmp_path, monkeypatch):
    """The folder vLLM is built from, written from an fsdp2 policy (one process: its parameters are
    DTensors, which full_state gathers one by one as under more): the tensors go into files of at most
    `file_bytes` as they come, so at every tensor full_state gives, those it gave before and that are still
    held sum to at most file_bytes plus the one just before (which the loop still names). The tiny model's
    1.98 MB in files of 0.6 MB: a writer that kept every tensor until the end would hold up to 1.7 MB, over
    the bound of 0.6 + 0.26 MB (its largest tensor). transformers loads the folder (its index and files)
    into the policy's own logits. The engine's memory estimate (model_shape) finds the sharded layers."""
    from transformers import AutoModelForCausalLM

    from tests.trainer.test_engine import small_spec
    from trainer.distributed.memory import model_shape
    from trainer.engine import Engine
    from trainer.rollout import vllm_engine

    spec = TrainSpec.model_validate(small_spec(distributed={"strategy": "fsdp2"}))
    engine = Engine(spec, tmp_path / "run", progress=False)
    engine.setup()
    assert any(type(p).__name__ == "DTensor" for p in engine.model.parameters())
    assert model_shape(engine.model).num_layers == engine.model.config.num_hidden_layers

    file_bytes, sizes, held, given = 600_000, [], [], []

    def tracked(model):
        for name, tensor in full_state(model):
            value = (
                tensor.clone()
            )  # host, contiguous: the writer keeps this very object until its file is out
            held.append(sum(_bytes(ref()) for ref in given[:-1]))  # (no strong reference kept here)
            given.append(weakref.ref(value))
            sizes.append(value.numel() * value.element_size())
            yield name, value

    monkeypatch.setattr(vllm_engine, "full_state", tracked)
    folder = tmp_path / "policy"
    vllm_engine._save_policy(engine.model, engine.tokenizer, folder, file_bytes=file_bytes)
    total = sum(sizes)
    assert total == 1_979_904 and max(held) <= file_bytes < total - max(sizes)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) == 4 and files[-1] == "model-00004-of-00004.safetensors"
    assert index["metadata"]["total_size"] == total
    assert sorted(p.name for p in folder.glob("*.safetensors")) == files
    assert all(Path(folder / f).stat().st_size <= file_bytes + 4096 for f in files)  # + a header each

    ids = torch.tensor([[1, 5, 6, 7, 8, 9, 10]])
    loaded = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad(), engine.strategy.full_weights(engine.model) as full:
        expected = full(input_ids=ids).logits
        assert torch.equal(loaded(input_ids=ids).logits, expected)


def _bytes(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.numel() * tensor.element_size()
