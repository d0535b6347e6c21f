"""Placement: how much memory a job needs per device, which worker class runs it, and why not, answered by
one call (`place_job`). Torch-free: the service decides placement (POST /v1/jobs and /estimate call
`place_job` once), and the workers advertise with the same model.

A `WorkerClass` is what one kind of worker offers: the Celery queue it consumes, the strategies it runs, the
nodes it can span (1, or the Ray cluster's node count), processes per node, memory per device, the device
kind and the rollout engines it has. Live workers advertise theirs in the worker registry
(store.repository.workers); operators declare classes for capacity that is not up yet
(STARE_WORKER_CLASSES, docs/SERVICE.md).

`place_job` measures the job, then `place` picks the class. The memory per device is `job_memory`'s
(`estimate_memory` at the spec's micro-batch: micro_batch_size responses, each the longest prompt plus
max_new_tokens tokens) on the model's `ModelShape` (contract.catalog: a built-in model's, or one the
deployment declares a config for; an unknown model is never refused on memory), plus what a vllm engine
holds beside the training state on a CPU. `place` returns the class whose queue the job goes to, or raises
`CapacityError` naming the spec field that no class can meet and the largest class for it. The checks run
in a fixed order, each over the classes that passed the ones before: strategy, nodes, processes per node,
rollout engine, memory per device. So the field named is the first one no class can satisfy together with
what the job already asked for, and the class named is the largest of those that got that far.

`estimate_memory` is the per-process memory of one training step (parameters, gradients, AdamW state,
activations of one micro-batch) for either strategy at N processes; docs/DISTRIBUTED.md says how it maps
onto a process's peak RSS and how it was checked (tests/trainer/test_fsdp2.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from contract.catalog import ModelShape, model_shape
from contract.estimate import MemoryPerDevice
from contract.spec import TrainSpec

Strategy = Literal["ddp", "fsdp2"]
RolloutEngine = Literal["hf", "vllm"]
# peft's default LoRA targets for Llama (trainer.models.apply_lora with target_modules None).
DEFAULT_LORA_TARGETS = ("q_proj", "v_proj")
GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


class WorkerClass(BaseModel):
    """What one kind of worker can run. `memory_per_device_bytes` None: not stated (no memory refusal)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    queue: Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:@-]+$")]
    strategies: Annotated[tuple[Strategy, ...], Field(min_length=1)] = ("ddp", "fsdp2")
    nodes: Annotated[int, Field(ge=1, le=1024)] = 1
    processes_per_node: Annotated[int, Field(ge=1, le=4096)] = 1
    memory_per_device_bytes: Annotated[int, Field(ge=1)] | None = None
    device: Literal["cpu", "cuda"] = "cpu"
    rollout_engines: Annotated[tuple[RolloutEngine, ...], Field(min_length=1)] = ("hf",)


@dataclasses.dataclass(frozen=True)
class Offer:
    """A worker class as placement sees it: where it comes from (for messages) and whether it is up now."""

    label: str  # e.g. "declared class 'gpu-8'", "live worker w-1@host"
    worker_class: WorkerClass
    live: bool


@dataclasses.dataclass(frozen=True)
class JobNeeds:
    strategy: Strategy
    nodes: int
    processes_per_node: int
    rollout_engine: RolloutEngine
    memory_per_device_bytes: int | None  # None: unknown (a model without a known shape)
    processes_param: str = "spec.distributed.processes_per_node"  # the field the request spelled it with
    memory_param: str = "spec.optim.micro_batch_size"  # the field that drives the memory
    # What a process holds beside the training step on a CPU device only (`vllm_cpu_resident_bytes`): a vllm
    # job's engine keeps its copy of the weights and its KV cache there, with no sleep mode to free them.
    cpu_resident_bytes: int = 0


class CapacityError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclasses.dataclass(frozen=True)
class JobPlacement:
    """Where a job goes: the offer whose queue it is routed to, and its memory per device (None: a model
    whose shape the deployment does not know)."""

    offer: Offer
    memory: MemoryPerDevice | None

    @property
    def queue(self) -> str:
        return self.offer.worker_class.queue


def place_job(
    spec: TrainSpec,
    offers: Sequence[Offer],
    *,
    prompt_tokens: Callable[[], int],
    configs: Mapping[str, Mapping[str, int | bool]] | None = None,
    processes_param: str = "spec.distributed.processes_per_node",
    prefer_queue: str | None = None,
) -> JobPlacement:
    """The worker class `spec` runs on and its memory per device, or CapacityError naming the spec field no
    class meets and the largest class for it. `prompt_tokens`: an upper bound on the longest prompt in
    tokens, asked only where the model's shape is known (the service reads it off the task). `configs`: the
    extra models the deployment declares configs for; `processes_param`: the field the request spelled the
    processes with; `prefer_queue`: the deployment's default queue (`place`)."""
    shape = model_shape(spec.model.name, configs or {})
    memory, param, resident = None, "spec.model.name", 0
    if shape is not None:
        prompt = prompt_tokens()
        estimate = job_memory(spec, shape, prompt)
        memory = memory_per_device(spec, estimate, prompt)
        param, resident = memory_param(spec, estimate), vllm_cpu_resident_bytes(spec, shape)
    dist = spec.distributed
    needs = JobNeeds(
        strategy=dist.strategy,
        nodes=dist.nodes,
        processes_per_node=dist.processes_per_node,
        rollout_engine=spec.rollout.engine,
        memory_per_device_bytes=memory.total_bytes if memory is not None else None,
        processes_param=processes_param,
        memory_param=param,
        cpu_resident_bytes=resident,
    )
    return JobPlacement(place(needs, offers, prefer_queue=prefer_queue), memory)


def place(needs: JobNeeds, offers: Sequence[Offer], *, prefer_queue: str | None = None) -> Offer:
    """The offer the job is routed to, else CapacityError naming the field and the largest class. Of the
    offers that can run it: one on `prefer_queue` (the deployment's default queue) first, then live before
    declared, then the smallest (nodes, processes per node, memory), so larger classes stay free for
    the jobs that need them; ties keep the given order."""
    candidates = _running_the_strategy(needs, offers)
    candidates = _with_room(needs, candidates)
    candidates = _with_memory(needs, candidates)
    return min(candidates, key=lambda o: _fit_order(o, prefer_queue))


def _running_the_strategy(needs: JobNeeds, offers: Sequence[Offer]) -> list[Offer]:
    """The offers whose class runs the job's distributed strategy; CapacityError when there is none."""
    if not offers:
        raise CapacityError(
            "no worker class is live or declared on this deployment (STARE_WORKER_CLASSES)",
            "spec.distributed",
        )
    candidates = [o for o in offers if needs.strategy in o.worker_class.strategies]
    if not candidates:
        offered = sorted({s for o in offers for s in o.worker_class.strategies})
        raise CapacityError(
            f"distributed.strategy is {needs.strategy!r}, but no worker class of this deployment runs it "
            f"(strategies offered: {', '.join(offered)})",
            "spec.distributed.strategy",
        )
    return candidates


def _with_room(needs: JobNeeds, candidates: list[Offer]) -> list[Offer]:
    """The candidates with the nodes, the processes per node and the rollout engine the job asks for, each
    refused in that order naming the largest class."""
    candidates = _keep(
        candidates,
        lambda c: c.nodes >= needs.nodes,
        lambda c: c.nodes,
        lambda best: (
            f"distributed.nodes is {needs.nodes}, but the largest worker class running "
            f"{needs.strategy} ({best.label}) spans {best.worker_class.nodes} node"
            f"{'s' if best.worker_class.nodes != 1 else ''}"
        ),
        "spec.distributed.nodes",
    )
    candidates = _keep(
        candidates,
        lambda c: c.processes_per_node >= needs.processes_per_node,
        lambda c: c.processes_per_node,
        lambda best: (
            f"{needs.processes_param.removeprefix('spec.')} is {needs.processes_per_node}, but the largest "
            f"worker class for this job ({best.label}) has {best.worker_class.processes_per_node} "
            "processes per node"
        ),
        needs.processes_param,
    )
    candidates = _keep(
        candidates,
        lambda c: needs.rollout_engine in c.rollout_engines,
        lambda c: len(c.rollout_engines),
        lambda best: (
            f"rollout.engine is {needs.rollout_engine!r}, but no worker class that can run this job has "
            f"it (e.g. {best.label} has {', '.join(best.worker_class.rollout_engines)})"
        ),
        "spec.rollout.engine",
    )
    return candidates


def _with_memory(needs: JobNeeds, candidates: list[Offer]) -> list[Offer]:
    """The candidates with the memory per device the job needs (on a CPU class, vLLM's resident copy and
    cache beside the training's); a refusal names rollout.engine when the job fits without vLLM."""
    need = needs.memory_per_device_bytes

    def need_on(c: WorkerClass) -> int:
        return (need or 0) + (needs.cpu_resident_bytes if c.device == "cpu" else 0)

    def memory_refusal(best: Offer) -> str:
        c = best.worker_class
        vllm = needs.cpu_resident_bytes if c.device == "cpu" else 0
        beside = f" ({_gib(need or 0)} for training + {_gib(vllm)} for vLLM's copy and cache)" if vllm else ""
        return (
            f"the job needs {_gib(need_on(c))} per device{beside}, but the largest worker class for it "
            f"({best.label}) has {_gib(c.memory_per_device_bytes or 0)} per device"
        )

    fits_without_vllm = need is not None and any(
        c.memory_per_device_bytes is None or c.memory_per_device_bytes >= need
        for c in (o.worker_class for o in candidates)
    )
    return _keep(
        candidates,
        lambda c: (
            need is None or c.memory_per_device_bytes is None or c.memory_per_device_bytes >= need_on(c)
        ),
        lambda c: c.memory_per_device_bytes or 0,
        memory_refusal,
        "spec.rollout.engine" if needs.cpu_resident_bytes and fits_without_vllm else needs.memory_param,
    )


def _keep(candidates, fits, size, message, param):  # type: ignore[no-untyped-def]
    kept = [o for o in candidates if fits(o.worker_class)]
    if kept:
        return kept
    best = max(candidates, key=lambda o: size(o.worker_class))
    raise CapacityError(message(best), param)


def _fit_order(offer: Offer, prefer_queue: str | None) -> tuple[bool, bool, int, int, int]:
    c = offer.worker_class
    unbounded = 2**62  # memory not stated sorts after every stated size
    return (
        c.queue != prefer_queue,
        not offer.live,
        c.nodes,
        c.processes_per_node,
        c.memory_per_device_bytes or unbounded,
    )


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


# --- a job's memory per device ----------------------------------------------------------------------------

# vLLM's KV cache on a CPU (its VLLM_CPU_KVCACHE_SPACE, which trainer/rollout/vllm_engine.py sets from this).
VLLM_CPU_KV_CACHE_GIB = 1


def vllm_cpu_resident_bytes(spec: TrainSpec, shape: ModelShape) -> int:
    """What a vllm job's engine holds per process on a CPU beside the training state: its own copy of the
    weights in the model's dtype (LoRA merged: the base's shape) and its KV cache. 0 for other engines."""
    if spec.rollout.engine != "vllm":
        return 0
    return shape.parameters * DTYPE_BYTES[spec.model.dtype] + VLLM_CPU_KV_CACHE_GIB * GIB


def lora_parameters(shape: ModelShape, r: int, target_modules: Sequence[str] | None) -> int:
    """Adapter parameters: r·(in + out) per targeted projection and layer. Names the estimate does not
    know (not a Llama projection) count as the widest projection, so the figure stays an upper bound."""
    kv_width = shape.num_key_value_heads * (shape.hidden_size // shape.num_attention_heads)
    h, i = shape.hidden_size, shape.intermediate_size
    widths = {
        "q_proj": (h, h),
        "k_proj": (h, kv_width),
        "v_proj": (h, kv_width),
        "o_proj": (h, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    widest = max(a + b for a, b in widths.values())
    per_layer = sum(
        sum(widths[t]) if t in widths else widest for t in (target_modules or DEFAULT_LORA_TARGETS)
    )
    return shape.num_layers * r * per_layer


def micro_batch_tokens(spec: TrainSpec, prompt_tokens: int) -> int:
    """Tokens in one forward/backward: micro_batch_size responses (at most a step's), each the longest
    prompt plus max_new_tokens."""
    rows = min(spec.optim.micro_batch_size, spec.responses_per_step)
    return rows * (prompt_tokens + spec.sampling.max_new_tokens)


def job_memory(spec: TrainSpec, shape: ModelShape, prompt_tokens: int) -> MemoryEstimate:
    """Per-device bytes of one training step of `spec` on a model of `shape` (or of its rollout, when that is
    larger: fsdp2 with HF generate gathers the full weights)."""
    if spec.model.lora is not None:
        adapters = lora_parameters(shape, spec.model.lora.r, spec.model.lora.target_modules)
        shape = dataclasses.replace(
            shape, parameters=shape.parameters + adapters, trainable_parameters=adapters
        )
    dist = spec.distributed
    return estimate_memory(
        shape,
        strategy=dist.strategy,
        processes=dist.world_size,
        micro_batch_tokens=micro_batch_tokens(spec, prompt_tokens),
        param_dtype=dist.mixed_precision.param_dtype,
        activation_checkpointing=dist.activation_checkpointing,
        rollout_full_weights=spec.rollout.engine == "hf",
    )


def memory_param(spec: TrainSpec, estimate: MemoryEstimate) -> str:
    """The spec field that drives a job's memory: the micro-batch when activations dominate; else the
    strategy under ddp (fsdp2 shards the model state), else the model."""
    if estimate.activations_bytes >= estimate.model_state_bytes + estimate.gathered_bytes:
        return "spec.optim.micro_batch_size"
    return "spec.distributed.strategy" if spec.distributed.strategy == "ddp" else "spec.model.name"


def memory_per_device(spec: TrainSpec, estimate: MemoryEstimate, prompt_tokens: int) -> MemoryPerDevice:
    """The estimate as the API shows it (contract.estimate.MemoryPerDevice)."""
    return MemoryPerDevice(
        strategy=spec.distributed.strategy,
        processes=spec.distributed.world_size,
        prompt_tokens=prompt_tokens,
        micro_batch_tokens=micro_batch_tokens(spec, prompt_tokens),
        parameters_bytes=estimate.parameters_bytes,
        gradients_bytes=estimate.gradients_bytes,
        optimizer_bytes=estimate.optimizer_bytes,
        gathered_bytes=estimate.gathered_bytes,
        activations_bytes=estimate.activations_bytes,
        not_coexisting_bytes=estimate.not_coexisting_bytes,
        rollout_gathered_bytes=estimate.rollout_gathered_bytes,
        total_bytes=estimate.total_bytes,
    )


# --- the memory of one training step ------------------------------------------------------------------------


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
    per_layer = _saved_per_token_and_layer(shape)
    activations = (
        micro_batch_tokens * _saved_per_token(shape, per_layer, activation_checkpointing) * act_bytes
    )
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


def _saved_per_token_and_layer(shape: ModelShape) -> int:
    """Values autograd keeps per token in one decoder layer (the widths counted above)."""
    head_dim = shape.hidden_size // shape.num_attention_heads
    return (
        _HIDDEN_WIDE_PER_LAYER * shape.hidden_size
        + _KV_WIDE_PER_LAYER * shape.num_key_value_heads * head_dim
        + _INTERMEDIATE_WIDE_PER_LAYER * shape.intermediate_size
    )


def _saved_per_token(shape: ModelShape, per_layer: int, activation_checkpointing: bool) -> int:
    """Values live per token of a micro-batch at backward's peak: every layer's (with checkpointing, each
    layer's input and one layer recomputed), the logits and the final norm, and backward's own peak."""
    if activation_checkpointing:
        per_token = shape.num_layers * shape.hidden_size + per_layer
    else:
        per_token = shape.num_layers * per_layer
    per_token += _VOCAB_WIDE * shape.vocab_size + 2 * shape.hidden_size  # logits; final norm
    per_token += _BACKWARD_INTERMEDIATE_WIDE * shape.intermediate_size
    return per_token


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
