"""Placement that knows the fleet: what a worker class can run, what a job needs, and which class runs it.

Torch-free (the service decides placement; the workers advertise with the same model). A `WorkerClass` is
what one kind of worker offers: the Celery queue it consumes, the strategies it runs, the nodes it can span
(1, or the Ray cluster's node count), processes per node, memory per device, the device kind and the
rollout engines it has. Live workers advertise theirs in the worker registry (store.repository.workers);
operators declare classes for capacity that is not up yet (STARE_WORKER_CLASSES, docs/SERVICE.md).

`place` takes a job's needs and the classes, and returns the class whose queue the job goes to, or raises
`CapacityError` naming the spec field that no class can meet and the largest class for it. The checks run
in a fixed order, each over the classes that passed the ones before: strategy, nodes, processes per node,
rollout engine, memory per device. So the field named is the first one no class can satisfy together with
what the job already asked for, and the class named is the largest of those that got that far.

`job_memory` is the memory per device of a job (contract.distributed.estimate_memory at the spec's
micro-batch: micro_batch_size responses, each the longest prompt plus max_new_tokens tokens), from a
`ModelShape` that `model_shape_from_config` derives from an HF config's fields (the built-in models' are in
contract.catalog.BUILTIN_CONFIGS).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from contract.catalog import BUILTIN_CONFIGS
from contract.distributed import DTYPE_BYTES, MemoryEstimate, ModelShape, estimate_memory
from contract.spec import TrainSpec

Strategy = Literal["ddp", "fsdp2"]
RolloutEngine = Literal["hf", "vllm"]
# peft's default LoRA targets for Llama (trainer.models.apply_lora with target_modules None).
DEFAULT_LORA_TARGETS = ("q_proj", "v_proj")
GIB = 1024**3


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


def place(needs: JobNeeds, offers: Sequence[Offer], *, prefer_queue: str | None = None) -> Offer:
    """The offer the job is routed to, else CapacityError naming the field and the largest class. Of the
    offers that can run it: one on `prefer_queue` (the deployment's default queue) first, then live before
    declared, then the smallest (nodes, processes per node, memory), so larger classes stay free for
    the jobs that need them; ties keep the given order."""
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
    candidates = _keep(
        candidates,
        lambda c: (
            need is None or c.memory_per_device_bytes is None or c.memory_per_device_bytes >= need_on(c)
        ),
        lambda c: c.memory_per_device_bytes or 0,
        memory_refusal,
        "spec.rollout.engine" if needs.cpu_resident_bytes and fits_without_vllm else needs.memory_param,
    )
    return min(candidates, key=lambda o: _fit_order(o, prefer_queue))


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


def model_shape_from_config(config: Mapping[str, int | bool]) -> ModelShape:
    """The ModelShape of a Llama-style decoder from its HF config's fields (what trainer.distributed.memory
    .model_shape reads off the built model): embeddings, per layer q/k/v/o, gate/up/down and two norms,
    the final norm, and an lm_head unless tied."""
    hidden, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    layers, vocab = int(config["num_hidden_layers"]), int(config["vocab_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    kv_width = kv_heads * (hidden // heads)
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_width + 3 * hidden * inter + 2 * hidden
    root = vocab * hidden + hidden + (0 if config.get("tie_word_embeddings", True) else vocab * hidden)
    total = layers * per_layer + root
    return ModelShape(
        parameters=total,
        trainable_parameters=total,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        largest_layer_parameters=max(per_layer, root),
    )


CONFIG_SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


def model_config_problem(config: Mapping[str, int | bool]) -> str | None:
    """What is wrong with a config's shape fields for `model_shape_from_config` (None: nothing)."""
    for field in (*CONFIG_SHAPE_FIELDS, "num_key_value_heads"):
        value = config.get(field)
        if field == "num_key_value_heads" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{field} must be a positive integer"
    heads = int(config["num_attention_heads"])
    if int(config["hidden_size"]) % heads or heads % int(config.get("num_key_value_heads") or heads):
        return "hidden_size must divide by num_attention_heads, and it by num_key_value_heads"
    return None


def model_shape(name: str, configs: Mapping[str, Mapping[str, int | bool]]) -> ModelShape | None:
    """A built-in model's shape, or that of an extra model whose config the deployment declares; None else."""
    builtin = builtin_model_shape(name)
    if builtin is not None or name not in configs:
        return builtin
    return model_shape_from_config(configs[name])


def builtin_model_shape(name: str) -> ModelShape | None:
    config = BUILTIN_CONFIGS.get(name)
    return model_shape_from_config(config) if config is not None else None


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
