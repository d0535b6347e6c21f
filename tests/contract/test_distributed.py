"""contract.distributed: the distributed spec's validation; and the memory estimate's arithmetic
(contract.fleet.estimate_memory)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from contract.catalog import ModelShape
from contract.distributed import DistributedSpec
from contract.fleet import estimate_memory

# SmolLM2-135M's shape (config.json of HuggingFaceTB/SmolLM2-135M-Instruct; tied embeddings).
SMOLLM2 = ModelShape(
    parameters=134_515_008,
    trainable_parameters=134_515_008,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49_152,
    largest_layer_parameters=28_312_128,  # the root: embeddings + final norm (30 layers of 3,540,096 + it)
)


def _error_locations(**fields: object) -> str:
    with pytest.raises(ValidationError) as info:
        DistributedSpec.model_validate(fields)
    return str(info.value)


def test_defaults_are_one_plain_process():
    spec = DistributedSpec()
    assert (spec.strategy, spec.world_size) == ("ddp", 1)
    assert DistributedSpec(nodes=2, processes_per_node=4).world_size == 8


@pytest.mark.parametrize(
    "fields,named",
    [
        ({"strategy": "zero3"}, "strategy"),
        ({"nodes": 0}, "nodes"),
        ({"processes_per_node": 0}, "processes_per_node"),
        ({"shards": 2}, "shards"),
        ({"mixed_precision": {"param_dtype": "float16"}, "strategy": "fsdp2"}, "mixed_precision.param_dtype"),
        ({"offload_optimizer": True}, "distributed.offload_optimizer"),
        ({"reshard_after_forward": False}, "distributed.reshard_after_forward"),
        ({"mixed_precision": "fp8"}, "distributed.mixed_precision"),
        ({"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16"}}, "reduce_dtype"),
        ({"num_processes": 2, "processes_per_node": 2}, "distributed.num_processes"),
        (
            {"strategy": "fsdp2", "mixed_precision": {"reduce_dtype": "bfloat16"}},
            "distributed.mixed_precision.reduce_dtype",
        ),
    ],
)
def test_bad_fields_are_refused_naming_the_field(fields, named):
    assert named in _error_locations(**fields)


def test_the_one_node_spellings_still_mean_what_they_meant():
    old = DistributedSpec.model_validate({"num_processes": 3, "mixed_precision": "bf16"})
    assert (old.nodes, old.processes_per_node, old.num_processes, old.world_size) == (1, 3, 3, 3)
    assert old.mixed_precision.param_dtype == "bfloat16" and old.mixed_precision.reduce_dtype == "float32"
    assert DistributedSpec.model_validate({"mixed_precision": "no"}) == DistributedSpec()
    assert "num_processes" not in DistributedSpec(processes_per_node=2).model_dump()


def test_fsdp2_accepts_its_options():
    spec = DistributedSpec(
        strategy="fsdp2",
        reshard_after_forward=False,
        offload_optimizer=True,
        activation_checkpointing=True,
        mixed_precision={"param_dtype": "bfloat16", "reduce_dtype": "bfloat16"},
    )
    assert spec.mixed_precision.param_dtype == "bfloat16"
    assert DistributedSpec(activation_checkpointing=True).activation_checkpointing  # ddp can recompute too


def test_fsdp2_divides_the_model_state_by_the_processes():
    ddp = estimate_memory(SMOLLM2, strategy="ddp", processes=1, micro_batch_tokens=1)
    assert ddp.parameters_bytes == 4 * SMOLLM2.parameters
    assert ddp.optimizer_bytes == 8 * SMOLLM2.trainable_parameters  # AdamW: two fp32 moments
    for n in (2, 4, 8):
        fsdp = estimate_memory(SMOLLM2, strategy="fsdp2", processes=n, micro_batch_tokens=1)
        assert fsdp.model_state_bytes == pytest.approx(ddp.model_state_bytes / n, rel=1e-6)
        assert fsdp.gathered_bytes == 2 * 4 * SMOLLM2.largest_layer_parameters
        ddp_n = estimate_memory(SMOLLM2, strategy="ddp", processes=n, micro_batch_tokens=1)
        assert ddp_n.gradients_bytes == 2 * ddp.gradients_bytes  # the all-reduce buckets
        assert ddp_n.parameters_bytes == ddp.parameters_bytes


def test_activations_scale_with_tokens_and_shrink_with_checkpointing():
    one = estimate_memory(SMOLLM2, strategy="ddp", processes=1, micro_batch_tokens=1000)
    two = estimate_memory(SMOLLM2, strategy="ddp", processes=1, micro_batch_tokens=2000)
    assert two.activations_bytes == 2 * one.activations_bytes
    recomputed = estimate_memory(
        SMOLLM2, strategy="ddp", processes=1, micro_batch_tokens=1000, activation_checkpointing=True
    )
    # Checkpointing keeps each layer's input (hidden-wide) instead of its saved values, plus one layer
    # recomputed: per layer 9·576 + 2·3·64 + 4·1536 = 11,712 values per token, fp32.
    per_layer = 9 * 576 + 2 * 3 * 64 + 4 * 1536
    saved = (29 * per_layer - 30 * 576) * 4 * 1000
    assert one.activations_bytes - recomputed.activations_bytes == saved
    bf16 = estimate_memory(
        SMOLLM2, strategy="fsdp2", processes=2, micro_batch_tokens=1000, param_dtype="bfloat16"
    )
    assert bf16.activations_bytes == one.activations_bytes // 2


def test_an_fsdp2_rollout_with_full_weights_counts_the_gathered_copy():
    """HF generate under fsdp2 above one process runs inside full_weights(): the full parameters (in
    param_dtype) beside the shards and AdamW's state; gradients are freed by then. The total is the larger
    of that and the training step; ddp and one process gather nothing."""
    kw = {"micro_batch_tokens": 64, "rollout_full_weights": True}
    fsdp = estimate_memory(SMOLLM2, strategy="fsdp2", processes=2, **kw)
    assert fsdp.rollout_gathered_bytes == 4 * SMOLLM2.parameters
    assert fsdp.rollout_bytes == fsdp.parameters_bytes + fsdp.optimizer_bytes + 4 * SMOLLM2.parameters
    # At 64 tokens the model state dominates: 2 + 4 + 4 bytes a parameter beat 2 + 2 + 4 and the buffers.
    assert fsdp.total_bytes == fsdp.rollout_bytes > fsdp.training_bytes
    bf16 = estimate_memory(SMOLLM2, strategy="fsdp2", processes=2, param_dtype="bfloat16", **kw)
    assert bf16.rollout_gathered_bytes == 2 * SMOLLM2.parameters
    # A long micro-batch: the training step's activations dominate again.
    long = estimate_memory(SMOLLM2, strategy="fsdp2", processes=2, micro_batch_tokens=200_000,
                           rollout_full_weights=True)  # fmt: skip
    assert long.total_bytes == long.training_bytes > long.rollout_bytes
    for strategy, n in (("ddp", 2), ("fsdp2", 1)):
        plain = estimate_memory(SMOLLM2, strategy=strategy, processes=n, **kw)
        assert plain.rollout_gathered_bytes == plain.rollout_bytes == 0
        assert plain.total_bytes == plain.training_bytes
    vllm = estimate_memory(SMOLLM2, strategy="fsdp2", processes=2, micro_batch_tokens=64)
    assert vllm.rollout_gathered_bytes == 0 and vllm.total_bytes == vllm.training_bytes


@pytest.mark.parametrize("bad", [{"processes": 0}, {"micro_batch_tokens": 0}])
def test_estimate_refuses_nonsense(bad):
    args = {"strategy": "ddp", "processes": 1, "micro_batch_tokens": 1, **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        estimate_memory(SMOLLM2, **args)
