"""The data-parallel strategy of a run (spec `distributed.strategy`), as one object: the only place in the
trainer that reads that field (`make_strategy`).

A `Strategy` answers every question the engine has about how the policy is laid out over the processes:
- `prepare(model)`: the model ready for training in this process (ddp: on the device, in DDP above one
  process; fsdp2: every decoder layer and the root sharded with `fully_shard` over the strategy's device
  mesh), with the precision policy applied (ddp: a bfloat16 autocast around the HF model's forward,
  installed as forward hooks; fsdp2: FSDP2's MixedPrecisionPolicy). A model built on the meta device (a
  resume from DCP shards, a fresh fsdp2 run above one process) is materialised here, after sharding, so
  that no process holds more than its shards; the non-persistent buffers are recomputed
  (`fill_non_persistent_buffers`), and a fresh run's shards are read from the weights' safetensors files
  (`from_files`: trainer.distributed.shard_load) or broadcast from rank 0's loaded model (`from_rank0`).
- `full_weights(model)`: a context yielding the module to run no-grad forwards and `generate` on, with
  full parameters in every process while it runs (fsdp2: every unit gathered once and kept gathered, then
  resharded; the forwards it ran are forgotten, so processes that made different numbers of them never
  meet in mismatched collectives). HF generate, evaluation, the π_old, π_ref and TIS passes run in it.
- `full_state(model)`: the policy's full tensors in transformers' names, one at a time (a DTensor shard is
  gathered as it is reached), LoRA adapters merged into their base weights; the vLLM weight push, the
  consolidated HF export and the KL reference copy read it. It is the one place LoRA is merged.
- `policy(model)`: the module under DDP's wrapper (peft's wrapper kept), whose parameters are the policy's.
- `sharded`, `prompt_sharing`: what the update needs to know to keep the processes' collectives in step.

The views inside the wrappers (the transformers model, peft's model and config, the decoder layers) are
trainer/models.py's; nothing else in the trainer unwraps a model.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, cast

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from contract.distributed import DistributedSpec
from trainer.distributed import shard_load
from trainer.models import decoder_layers, hf_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PromptSharing = Literal["rows", "never", "agreed"]
Files = Sequence[Path]  # safetensors files of a model's weights (prepare's from_files)


def make_strategy(spec: DistributedSpec, device: torch.device, world_size: int) -> Strategy:
    """The strategy `spec` names, for a process computing on `device` in a group of `world_size` processes
    (the Runtime makes it, for the group it joined)."""
    strategies: dict[str, type[Strategy]] = {"ddp": DDP, "fsdp2": FSDP2}
    return strategies[spec.strategy](spec, device, world_size)


# --- full tensors ------------------------------------------------------------------------------------------


def _full(tensor: Tensor) -> Tensor:
    """The whole tensor: a DTensor shard gathered from every process (collective), a plain tensor as is."""
    value = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    return value.detach()


def full_state(model: Any) -> Iterator[tuple[str, Tensor]]:
    """(name, full tensor) for every parameter and persistent buffer of the policy, in transformers' names,
    one at a time; tied weights once (named_parameters deduplicates). A LoRA layer gives its base weight
    with every active adapter's ΔW added (peft's own `get_delta_weight`), the adapters themselves left
    out. Collective under fsdp2: every process iterates to the end, in the same order."""
    inner = hf_model(model)
    modules = dict(inner.named_modules())
    for name, param in inner.named_parameters():
        if ".lora_" in name:
            continue
        value = _full(param)
        if ".base_layer." in name:
            owner_name, leaf = name.rsplit(".base_layer.", 1)
            owner = modules[owner_name]
            if leaf == "weight":
                adapters = [a for a in owner.active_adapters if a in owner.lora_A]
                for adapter in adapters:
                    value = value + _full(owner.get_delta_weight(adapter)).to(value.dtype)
            name = f"{owner_name}.{leaf}"
        yield name, value
    for module_name, module in inner.named_modules():
        for leaf, buffer in module.named_buffers(recurse=False):
            if buffer is not None and leaf not in module._non_persistent_buffers_set:
                yield (f"{module_name}.{leaf}" if module_name else leaf), _full(buffer)


def full_adapter_state(model: Any) -> dict[str, Tensor]:
    """A LoRA model's trainable tensors (its adapters), whole, on the CPU, in the peft model's names, on rank
    0; an empty dict on the other processes. Collective under fsdp2 (the shards are gathered)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    state = get_model_state_dict(model, options=options)
    return {name: value for name, value in state.items() if isinstance(value, Tensor)}


def plain_copy(model: Any) -> Any:
    """A plain (unwrapped, unsharded, adapters merged) transformers model with `model`'s full weights, on
    the device of its parameters. Collective under fsdp2."""
    from transformers import AutoModelForCausalLM

    inner = hf_model(model)
    with torch.device("meta"):
        out: Any = AutoModelForCausalLM.from_config(inner.config, dtype=next(inner.parameters()).dtype)
    device = _local(next(inner.parameters())).device
    out.to_empty(device=device)
    load_full_state(out, full_state(model))
    fill_non_persistent_buffers(out)
    out.generation_config = copy.deepcopy(inner.generation_config)
    return out


def load_full_state(model: Any, weights: Iterable[tuple[str, Tensor]]) -> None:
    """Copies `full_state`'s tensors into a plain transformers model as they come (one full tensor at a
    time beside the model): every key must match but the tied ones full_state gives once (the LM head of
    tied embeddings), which are tied again after."""
    target = model.state_dict()
    unexpected, loaded = [], set()
    with torch.no_grad():
        for name, tensor in weights:
            if name not in target:
                unexpected.append(name)
                continue
            target[name].copy_(tensor)
            loaded.add(name)
    untied = sorted(key for key in set(target) - loaded if not _is_tied(model, key))
    if unexpected or untied:
        raise ValueError(
            f"full weights do not fit the model: missing {untied}, unexpected {sorted(unexpected)}"
        )
    model.tie_weights()


def _is_tied(model: Any, key: str) -> bool:
    return key in getattr(model, "all_tied_weights_keys", {}) or (
        key == "lm_head.weight" and bool(getattr(model.config, "tie_word_embeddings", False))
    )


def _local(tensor: Tensor) -> Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def fill_non_persistent_buffers(model: Any) -> None:
    """Recomputes the buffers no checkpoint holds (rotary inverse frequencies), after a model built on the
    meta device was materialised: transformers' own initialiser, on the modules that own such buffers."""
    inner = hf_model(model)
    for module in inner.modules():
        if module._non_persistent_buffers_set and not any(True for _ in module.parameters(recurse=False)):
            with torch.no_grad():
                inner._init_weights(module)


# --- the strategies ----------------------------------------------------------------------------------------


class Strategy:
    """See the module docstring."""

    name: ClassVar[str]

    def __init__(self, spec: DistributedSpec, device: torch.device, world_size: int) -> None:
        self.spec, self.device, self.world_size = spec, device, world_size

    @property
    def sharded(self) -> bool:
        """Whether a parameter is split over the processes (each holds a shard)."""
        return False

    @property
    def prompt_sharing(self) -> PromptSharing:
        """How a training forward may run a group's shared prompt once (trainer.policy.scoring.response_logits):
        "rows" (where the rows share one: a lone process), "never" (every call the full forward: DDP syncs
        buffers in each call), "agreed" (one choice for every process and micro-batch: sharded layers
        all-gather in each call; trainer.policy.update.micro_batch_plan)."""
        return "rows"

    @property
    def fills_from_rank0(self) -> bool:
        """Whether `prepare(..., from_rank0=True)` is taken: rank 0 alone loads the weights."""
        return False

    def prepare(
        self, model: nn.Module, *, trainable: bool = True, from_rank0: bool = False, from_files: Files = ()
    ) -> nn.Module:
        raise NotImplementedError

    def policy(self, model: nn.Module) -> nn.Module:
        """The module under DDP's wrapper (an FSDP2 model is its own module: fully_shard wraps in place)."""
        return model.module if isinstance(model, DistributedDataParallel) else model

    @contextlib.contextmanager
    def full_weights(self, model: nn.Module) -> Iterator[nn.Module]:
        yield self.policy(model)

    def full_state(self, model: nn.Module) -> Iterator[tuple[str, Tensor]]:
        return full_state(model)

    def full_copy(self, model: nn.Module) -> nn.Module:
        """A copy of the policy as it is now with full weights, not yet laid out (`prepare(copy,
        trainable=False)` does that): the KL reference π_ref."""
        raise NotImplementedError

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """A block whose backwards leave the gradients unsynchronised (the last micro-batch syncs them)."""
        return contextlib.nullcontext()

    def grad_norm(self, grads: list[Tensor]) -> Tensor:
        """The global 2-norm of the gradients over every process."""
        return torch.nn.utils.get_total_norm(grads, norm_type=2.0)

    def _check_world(self) -> None:
        if self.world_size != self.spec.world_size:
            raise ValueError(
                f"distributed.strategy {self.name}: the process group has {self.world_size} processes, "
                f"the spec {self.spec.world_size}"
            )

    def _checkpoint_activations(self, model: nn.Module) -> None:
        inner = hf_model(model)
        enable = getattr(inner, "gradient_checkpointing_enable", None)
        if not callable(enable):
            raise ValueError(
                f"activation checkpointing: {type(inner).__name__} has no gradient_checkpointing_enable"
            )
        # Non-reentrant: the reentrant form needs an input that requires grad, which frozen (LoRA)
        # embeddings do not give.
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class _Autocast:
    """ddp's bfloat16 compute: the HF model's forward runs under autocast (entered by a forward pre-hook,
    left by a forward hook that runs even when the forward raises); weights, gradients (so DDP's
    all-reduce) and AdamW stay float32. Nested forwards nest their contexts."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.open: list[torch.autocast] = []

    def enter(self, _module: nn.Module, _args: Any) -> None:
        context = torch.autocast(self.device_type, dtype=torch.bfloat16)
        context.__enter__()
        self.open.append(context)

    def leave(self, _module: nn.Module, _args: Any, _output: Any) -> None:
        if self.open:
            self.open.pop().__exit__(None, None, None)

    def install(self, model: nn.Module) -> None:
        inner = hf_model(model)
        inner.register_forward_pre_hook(self.enter)
        inner.register_forward_hook(self.leave, always_call=True)


class DDP(Strategy):
    """Every process holds the whole model; gradients are all-reduced (DistributedDataParallel)."""

    name = "ddp"

    @property
    def prompt_sharing(self) -> PromptSharing:
        return "never" if self.spec.world_size > 1 else "rows"

    def prepare(
        self, model: nn.Module, *, trainable: bool = True, from_rank0: bool = False, from_files: Files = ()
    ) -> nn.Module:
        del from_rank0  # every ddp process holds the whole model
        if from_files:
            raise ValueError("distributed.strategy ddp: every process loads the whole model, not its shards")
        self._check_world()
        if trainable and self.spec.activation_checkpointing:
            self._checkpoint_activations(model)
        if any(p.is_meta for p in model.parameters()):
            model.to_empty(device=self.device)
            hf_model(model).tie_weights()
            fill_non_persistent_buffers(model)
        if trainable and self.spec.mixed_precision.param_dtype == "bfloat16":
            _Autocast(self.device.type).install(model)
        model.to(self.device)
        if not trainable or self.spec.world_size == 1:
            return model
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def full_copy(self, model: nn.Module) -> nn.Module:
        return copy.deepcopy(self.policy(model))  # (its precision hooks come along)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        # DDP defers its all-reduce to the last micro-batch's backward.
        return model.no_sync() if isinstance(model, DistributedDataParallel) else contextlib.nullcontext()


_RESHARD_AFTER_FORWARD: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


class FSDP2(Strategy):
    """Every parameter a DTensor sharded on dim 0 over a one-dimensional device mesh (`fully_shard` on each
    decoder layer, then on the root, which keeps the embeddings, final norm and LM head: tied embeddings
    stay one parameter). A layer's full weights exist only while it runs. A peft model is sharded through
    its base model, so adapters and frozen weights are sharded alike. Every process first takes rank 0's
    weights, as DDP does (peft draws LoRA's initial A from a per-rank RNG)."""

    name = "fsdp2"

    def __init__(self, spec: DistributedSpec, device: torch.device, world_size: int) -> None:
        super().__init__(spec, device, world_size)
        self._mesh: Any = None

    @property
    def sharded(self) -> bool:
        return True

    @property
    def prompt_sharing(self) -> PromptSharing:
        return "agreed" if self.spec.world_size > 1 else "rows"

    @property
    def fills_from_rank0(self) -> bool:
        return self.spec.world_size > 1

    @property
    def mesh(self) -> Any:
        """The device mesh the parameters are sharded over (one dimension: the processes)."""
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(self.device.type, (self.spec.world_size,))
        return self._mesh

    def prepare(
        self, model: nn.Module, *, trainable: bool = True, from_rank0: bool = False, from_files: Files = ()
    ) -> nn.Module:
        """`from_files`: every process holds a skeleton on the meta device (trainer.models.skeleton_of),
        shards it, allocates its shards only and fills them from these safetensors files, reading only its
        own slice of each tensor (trainer.distributed.shard_load): no process ever holds the whole model.
        `from_rank0`: rank 0 holds the loaded weights (a model built in code: no files), every other process
        a skeleton. Rank 0 keeps its tensors aside and turns its model into a skeleton too; every process
        shards its skeleton and allocates its shards only; rank 0's tensors are then broadcast into them,
        so no process but rank 0 ever holds the whole model."""
        self._check_world()
        if from_files and (from_rank0 or not all(p.is_meta for p in model.parameters())):
            raise ValueError(
                "prepare(from_files=...) takes a skeleton on the meta device, without from_rank0"
            )
        spec = self.spec
        loaded: dict[str, Any] = {}
        if from_rank0 and self.world_size > 1 and not any(p.is_meta for p in model.parameters()):  # rank 0
            loaded = model.state_dict()  # the loaded tensors, kept while the skeleton is sharded
            model.to("meta")
            hf_model(model).tie_weights()  # to("meta") makes a new parameter per tied module
        if trainable and spec.activation_checkpointing:
            self._checkpoint_activations(model)
        mp = spec.mixed_precision
        offload = trainable and spec.offload_optimizer
        options: dict[str, Any] = {
            "mesh": self.mesh,
            "reshard_after_forward": spec.reshard_after_forward,
            "mp_policy": MixedPrecisionPolicy(param_dtype=DTYPES[mp.param_dtype], reduce_dtype=DTYPES[mp.reduce_dtype]),
            "offload_policy": CPUOffloadPolicy(pin_memory=self.device.type == "cuda") if offload else OffloadPolicy(),
        }  # fmt: skip
        on_meta = any(p.is_meta for p in model.parameters())
        if not on_meta:
            if not offload:
                model.to(self.device)  # (with offloading, fully_shard moves each shard to host memory itself)
            _copy_rank0_weights(model, self.device, self.world_size)
        for unit in [*decoder_layers(model), hf_model(model)]:
            fully_shard(unit, **options)
            _RESHARD_AFTER_FORWARD[unit] = spec.reshard_after_forward
        if (
            on_meta
        ):  # each process allocates its shards only; the files, rank 0's weights or a checkpoint fill them
            model.to_empty(device="cpu" if offload else self.device)
            fill_non_persistent_buffers(model)
        if from_files:
            shard_load.load_shards_from_files(model, from_files)
        if from_rank0 and self.world_size > 1:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            fill = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_model_state_dict(model, loaded, options=fill)
            loaded.clear()
        return model

    def full_copy(self, model: nn.Module) -> nn.Module:
        """A plain model from the gathered full weights (adapters merged): a sharded policy cannot be
        deep-copied (its DTensor parameters are tied to FSDP's state)."""
        return cast(nn.Module, plain_copy(model))

    def grad_norm(self, grads: list[Tensor]) -> Tensor:
        # Each process holds a shard of every gradient: the norm of the DTensors is reduced over all of them.
        total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        return total.full_tensor() if isinstance(total, DTensor) else total

    @contextlib.contextmanager
    def full_weights(self, model: nn.Module) -> Iterator[nn.Module]:
        units = fsdp_units(model)
        policies = [_RESHARD_AFTER_FORWARD.get(cast(nn.Module, unit), True) for unit in units]
        marks: list[tuple[list[Any], int]] = []
        try:
            for unit in units:
                unit.set_reshard_after_forward(False, recurse=False)
                unit.unshard()
            marks = _forward_records(units)
            yield model
        finally:
            for unit, policy in zip(units, policies, strict=True):
                unit.reshard()
                unit.set_reshard_after_forward(policy, recurse=False)
            _forget_forwards_since(marks)


def fsdp_units(model: nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _copy_rank0_weights(model: nn.Module, device: torch.device, world_size: int) -> None:
    """Every process takes rank 0's parameters and buffers, as DDP does when it wraps a model. fully_shard
    keeps each process's own slice of whatever that process holds, so weights initialised differently per
    process would otherwise be stitched together from several initialisations."""
    if world_size == 1:
        return
    seen: set[int] = set()
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if id(tensor) in seen:  # tied weights once
                continue
            seen.add(id(tensor))
            staged = tensor.detach().to(device)  # NCCL needs device tensors; a no-op copy elsewhere
            torch.distributed.broadcast(staged, src=0)
            if staged.data_ptr() != tensor.data_ptr():
                tensor.copy_(staged)


def _forward_records(units: list[FSDPModule]) -> list[tuple[list[Any], int]]:
    """FSDP2 records every forward of a unit, no-grad ones included, in lists that only a backward clears
    (the order its backward prefetches all-gathers in). Forwards inside full_weights never get a backward,
    and processes make different numbers of them (dynamic sampling, uneven shares): left in the lists they
    would make the processes' next backwards prefetch in different orders, i.e. issue mismatched
    collectives (a hang, seen in the engine). The lists and their lengths on entry, so the context can
    drop what it added (torch-internal attributes: torch 2.11–2.13 checked)."""
    records: list[tuple[list[Any], int]] = []
    # The root's lazy initialisation (normally at its first forward) gives every unit the shared order list;
    # units[0] is the root (modules() lists it before its layers).
    units[0]._get_fsdp_state()._lazy_init()
    for unit in units:
        state = unit._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:
            single = getattr(state, "_fsdp_param_group", None)
            groups = [single] if single is not None else []
        for group in groups:
            order = getattr(group.comm_ctx, "post_forward_order", None)
            for record in (group._post_forward_indices, order):
                if record is not None and not any(seen is record for seen, _ in records):  # one per model
                    records.append((record, len(record)))
    return records


def _forget_forwards_since(records: list[tuple[list[Any], int]]) -> None:
    for record, length in records:
        del record[length:]
