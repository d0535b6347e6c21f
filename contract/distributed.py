"""How a job spreads over processes and machines: the `distributed` part of a job spec, and what it costs.

Torch-free (the service validates specs and estimates memory with it). `DistributedSpec` is a job spec's
`distributed` section: which data parallel strategy runs (`ddp`: every process holds the whole model,
gradients are all-reduced; `fsdp2`: parameters, gradients and optimizer state are sharded over the
processes, each decoder layer gathered only while it runs) and over how many nodes and processes per node.
Unknown fields are refused, and a field that only `fsdp2` reads set under `ddp` is refused naming it: a spec
never asks for something the engine would ignore.

Migration from the one-node spec (docs/DISTRIBUTED.md): `num_processes: N` is still accepted and means
`nodes: 1, processes_per_node: N`; `mixed_precision: "bf16"` / `"no"` mean
`{param_dtype: bfloat16}` / the float32 default. `num_processes` stays readable as the world size.

`estimate_memory` is the per-process memory of one training step (parameters, gradients, AdamW state,
activations of one micro-batch) for either strategy at N processes; docs/DISTRIBUTED.md says how it maps
onto a process's peak RSS and how it was checked (tests/trainer/test_fsdp2.py).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
# Fields that only the fsdp2 strategy reads (ddp keeps full fp32 parameters and the optimizer on the device).
FSDP2_ONLY_FIELDS = ("reshard_after_forward", "offload_optimizer")
# The one-node spec's spellings of mixed_precision.
LEGACY_MIXED_PRECISION = {"no": {}, "bf16": {"param_dtype": "bfloat16"}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class MixedPrecisionSpec(_Strict):
    """The dtype layers compute in (the master weights and the optimizer stay float32) and the dtype
    gradients are reduced in. fsdp2: its MixedPrecisionPolicy. ddp: bfloat16 autocast around the forward,
    gradients reduced in float32 (a bfloat16 reduce_dtype is refused there)."""

    param_dtype: Literal["float32", "bfloat16"] = "float32"
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"


class DistributedSpec(_Strict):
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    nodes: Annotated[int, Field(ge=1, le=1024)] = 1
    processes_per_node: Annotated[int, Field(ge=1, le=4096)] = 1
    # fsdp2: free each layer's gathered parameters after its forward (gathered again for backward): less
    # memory, one more all-gather per layer and step.
    reshard_after_forward: bool = True
    mixed_precision: MixedPrecisionSpec = Field(default_factory=MixedPrecisionSpec)
    # Recompute each decoder layer's activations in backward instead of keeping them.
    activation_checkpointing: bool = False
    # fsdp2: keep the sharded parameters, gradients and optimizer state in host memory (the step runs there).
    offload_optimizer: bool = False

    @property
    def world_size(self) -> int:
        return self.nodes * self.processes_per_node

    @property
    def num_processes(self) -> int:
        """The world size (the one-node spec's name for it)."""
        return self.world_size

    @model_validator(mode="before")
    @classmethod
    def _one_node_spellings(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "num_processes" in data:
            n = data.pop("num_processes")
            if "processes_per_node" in data or data.get("nodes", 1) != 1:
                raise ValueError(
                    "distributed.num_processes is the one-node spelling of processes_per_node: "
                    "give nodes and processes_per_node instead"
                )
            data["processes_per_node"] = n
        precision = data.get("mixed_precision")
        if isinstance(precision, str):
            if precision not in LEGACY_MIXED_PRECISION:
                raise ValueError(
                    f"distributed.mixed_precision must be 'no', 'bf16' or an object, got {precision!r}"
                )
            data["mixed_precision"] = LEGACY_MIXED_PRECISION[precision]
        return data

    @model_validator(mode="after")
    def _fsdp2_fields_need_fsdp2(self) -> DistributedSpec:
        if self.strategy == "ddp" and self.mixed_precision.reduce_dtype != "float32":
            raise ValueError(
                "distributed.mixed_precision.reduce_dtype: ddp reduces gradients in float32 "
                "(a bfloat16 reduce needs distributed.strategy 'fsdp2')"
            )
        if self.strategy != "fsdp2":
            for name in FSDP2_ONLY_FIELDS:  # plain defaults, read off the fields (no model built per check)
                if getattr(self, name) != DistributedSpec.model_fields[name].default:
                    raise ValueError(f"distributed.{name} applies only to distributed.strategy 'fsdp2'")
        if self.mixed_precision.reduce_dtype == "bfloat16" and self.mixed_precision.param_dtype == "float32":
            raise ValueError(
                "distributed.mixed_precision.reduce_dtype 'bfloat16' needs param_dtype 'bfloat16' "
                "(reducing float32 gradients in a lower precision than they were computed in only loses bits)"
            )
        return self


# --- memory -----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know of a decoder-only transformer (an HF config's fields)."""

    parameters: int  # distinct parameters (tied embeddings counted once)
    trainable_parameters: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    largest_layer_parameters: int  # the biggest unit fsdp2 gathers at once (a decoder layer or the root)


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per process for one training step."""

    parameters_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    gathered_bytes: int  # fsdp2: full copies of the layers being computed (all-gather buffers)
    activations_bytes: int
    # Gradients and activations counted above that are never live at once: gradients are freed after each
    # step (zero_grad(set_to_none=True)) and built by backward while it frees the activations.
    not_coexisting_bytes: int = 0
    # fsdp2 above one process with HF generate: the rollout and the evaluations run inside the strategy's
    # full_weights(), which gathers every unit's full parameters at once (param_dtype) beside the shards.
    rollout_gathered_bytes: int = 0

    @property
    def model_state_bytes(self) -> int:
        return self.parameters_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def training_bytes(self) -> int:
        """The peak of one optimiser step."""
        return (
            self.model_state_bytes + self.gathered_bytes + self.activations_bytes - self.not_coexisting_bytes
        )

    @property
    def rollout_bytes(self) -> int:
        """The peak of a rollout with full weights gathered: the shards, AdamW's state (kept across it) and
        the full copy; gradients are freed after each step, and sampling keeps no activations for backward."""
        if not self.rollout_gathered_bytes:
            return 0
        return self.parameters_bytes + self.optimizer_bytes + self.rollout_gathered_bytes

    @property
    def total_bytes(self) -> int:
        return max(self.training_bytes, self.rollout_bytes)


# Values autograd keeps per token and decoder layer (fp32 Llama-style block, SDPA attention), counted from
# what each op saves for backward (and checked with torch.autograd.graph.saved_tensors_hooks on the tiny
# model: 6,885 values per token saved against 6,978 counted here): RMSNorm 2 hidden-wide tensors each (x and
# x·rsqrt), the q/k/v projections' input, q before and after rotary, the attention output and o_proj's
# input; k and v (kv-wide); the MLP's gate, up, silu(gate) and their product (intermediate-wide).
_HIDDEN_WIDE_PER_LAYER = 9
_KV_WIDE_PER_LAYER = 2
_INTERMEDIATE_WIDE_PER_LAYER = 4
# Logits, their log-softmax (kept by cross-entropy) and the gradient of the logits in backward.
_VOCAB_WIDE = 3
# Backward's own peak: the gradients of one MLP's intermediate tensors live beside everything still saved.
_BACKWARD_INTERMEDIATE_WIDE = 2


def estimate_memory(
    shape: ModelShape,
    *,
    strategy: Literal["ddp", "fsdp2"],
    processes: int,
    micro_batch_tokens: int,
    param_dtype: Literal["float32", "bfloat16"] = "float32",
    activation_checkpointing: bool = False,
    rollout_full_weights: bool = False,
) -> MemoryEstimate:
    """Per-process bytes of one step of AdamW training with `processes` data-parallel processes.

    ddp: every process holds fp32 parameters, their gradients, AdamW's two fp32 moments per trainable
    parameter, plus DDP's gradient buckets (a second copy of the trainable gradients). fsdp2: each holds
    1/N of parameters, gradients and moments, plus the gathered full copy of the largest sharded unit (two,
    with prefetching of the next) in param_dtype. Activations are those of one micro-batch of
    `micro_batch_tokens` tokens; with checkpointing only each layer's input is kept, plus one layer's worth
    recomputed in backward. Gradients and activations are not all live at once (`not_coexisting_bytes`,
    subtracted from the total): the peak is the larger of all activations with the first unit's gradients
    and all gradients with one layer's activations. `rollout_full_weights` (HF generate): under fsdp2 above
    one process the rollout holds a full copy of the parameters beside the shards, and the total is the
    larger of the training step and the rollout (`MemoryEstimate.rollout_bytes`).
    """
    if processes < 1:
        raise ValueError(f"processes must be ≥ 1, got {processes}")
    if micro_batch_tokens < 1:
        raise ValueError(f"micro_batch_tokens must be ≥ 1, got {micro_batch_tokens}")
    fp32 = DTYPE_BYTES["float32"]
    act_bytes = DTYPE_BYTES[param_dtype]
    shards = processes if strategy == "fsdp2" else 1
    params = _ceil_div(shape.parameters * fp32, shards)
    grads = _ceil_div(shape.trainable_parameters * fp32, shards)
    optimizer = _ceil_div(2 * shape.trainable_parameters * fp32, shards)
    gathered = 0
    if strategy == "ddp" and processes > 1:
        grads *= 2  # the all-reduce buckets
    if strategy == "fsdp2" and processes > 1:
        gathered = 2 * shape.largest_layer_parameters * act_bytes
    head_dim = shape.hidden_size // shape.num_attention_heads
    per_layer = (
        _HIDDEN_WIDE_PER_LAYER * shape.hidden_size
        + _KV_WIDE_PER_LAYER * shape.num_key_value_heads * head_dim
        + _INTERMEDIATE_WIDE_PER_LAYER * shape.intermediate_size
    )
    if activation_checkpointing:
        per_token = shape.num_layers * shape.hidden_size + per_layer
    else:
        per_token = shape.num_layers * per_layer
    per_token += _VOCAB_WIDE * shape.vocab_size + 2 * shape.hidden_size  # logits; final norm
    per_token += _BACKWARD_INTERMEDIATE_WIDE * shape.intermediate_size
    activations = micro_batch_tokens * per_token * act_bytes
    # Backward runs from the loss to the embeddings: it first builds the gradients of the largest unit (the
    # root: LM head / tied embeddings), then layer by layer frees one layer's activations and builds that
    # layer's gradients. What is live above parameters and optimizer state is linear along the way, so its
    # peak is at an end: all activations with the first unit's gradients, or all gradients with one
    # layer's activations. (DDP's buckets above one process are allocated once and stay.)
    own_grads = _ceil_div(shape.trainable_parameters * fp32, shards)
    first_grads = min(own_grads, _ceil_div(shape.largest_layer_parameters * fp32, shards))
    layer_activations = micro_batch_tokens * per_layer * act_bytes
    live = max(activations + first_grads, own_grads + min(layer_activations, activations))
    rollout = shape.parameters * act_bytes if rollout_full_weights and shards > 1 else 0
    return MemoryEstimate(
        params, grads, optimizer, gathered, activations, activations + own_grads - live, rollout
    )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
