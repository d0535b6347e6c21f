"""Wrapping a causal LM for data-parallel training: DDP, or FSDP2 sharding with torch's fully_shard.

`wrap_model(model, spec, device)` is the one call the engine makes after loading the model and before
building the optimizer (the optimizer must see the sharded parameters):

- ddp: the model on `device`, in DistributedDataParallel when there is more than one process (at one
  process it is returned as it is: DDP would only add a wrapper).
- fsdp2: `fully_shard` on every decoder layer, then on the root module (which keeps the embeddings, the
  final norm and the LM head: tied embeddings are one parameter in one group, so they stay tied). Each
  parameter becomes a DTensor sharded on dim 0 over the processes (`Shard(0)`); a layer's full weights
  exist only while it runs. Every process first takes rank 0's weights (as DDP does). A peft (LoRA) model
  is sharded through its wrapped base model, so adapters and frozen base weights are sharded alike and
  peft's wrapper stays on top.

Activation checkpointing (HF's gradient checkpointing, non-reentrant) is switched on before sharding.
Decoder layers are found generically from the HF model's `_no_split_modules` (the classes HF itself never
splits across devices: LlamaDecoderLayer, Qwen3DecoderLayer, GPT2Block, ...).

`generation_context(model)` is the hybrid-engine switch: rollouts need the whole model in every process,
the update needs it sharded. Inside the context every FSDP2 unit is gathered once and kept gathered (no
all-gather per generated token); on exit the units are resharded and the resharding policy restored.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import nn
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
from trainer.distributed.process_group import world_size

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_RESHARD_AFTER_FORWARD: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def base_model(model: nn.Module) -> Any:
    """The HF model under any wrapper (DDP's `module`, peft's `base_model.model`): a PreTrainedModel, typed
    Any because nn.Module's attribute lookup hides its config."""
    if isinstance(model, DistributedDataParallel):
        model = model.module
    get_base = getattr(model, "get_base_model", None)  # peft
    return get_base() if callable(get_base) else model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks, in order: modules whose class HF lists in `_no_split_modules`."""
    hf_model = base_model(model)
    names = set(getattr(hf_model, "_no_split_modules", None) or ())
    layers = [m for m in hf_model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"cannot find the decoder layers of {type(hf_model).__name__}: its _no_split_modules "
            f"({sorted(names) or 'none'}) names no submodule"
        )
    return layers


def wrap_model(model: nn.Module, spec: DistributedSpec, device: torch.device) -> nn.Module:
    """The model ready for training under `spec` (see the module docstring). Call it once per model, in
    every process, after the process group is up (trainer.distributed.process_group.init_process_group)."""
    if world_size() != spec.world_size:
        raise ValueError(
            f"wrap_model: the process group has {world_size()} processes, the spec {spec.world_size}"
        )
    if spec.activation_checkpointing:
        _enable_activation_checkpointing(model)
    if spec.strategy == "ddp":
        model.to(device)
        if spec.world_size == 1:
            return model
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return _shard(model, spec, device)


def _enable_activation_checkpointing(model: nn.Module) -> None:
    hf_model = base_model(model)
    enable = getattr(hf_model, "gradient_checkpointing_enable", None)
    if not callable(enable):
        raise ValueError(
            f"activation checkpointing: {type(hf_model).__name__} has no gradient_checkpointing_enable"
        )
    # Non-reentrant: the reentrant form needs an input that requires grad, which frozen (LoRA) embeddings
    # do not give.
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _shard(model: nn.Module, spec: DistributedSpec, device: torch.device) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (spec.world_size,))
    mp = spec.mixed_precision
    options: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": spec.reshard_after_forward,
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=_DTYPES[mp.param_dtype], reduce_dtype=_DTYPES[mp.reduce_dtype]
        ),
        "offload_policy": CPUOffloadPolicy(pin_memory=device.type == "cuda")
        if spec.offload_optimizer
        else OffloadPolicy(),
    }
    if not spec.offload_optimizer:
        model.to(device)  # (with offloading, fully_shard moves each shard to host memory itself)
    _copy_rank0_weights(model, device)
    for unit in [*decoder_layers(model), base_model(model)]:
        fully_shard(unit, **options)
        _RESHARD_AFTER_FORWARD[unit] = spec.reshard_after_forward
    return model


def _copy_rank0_weights(model: nn.Module, device: torch.device) -> None:
    """Every process takes rank 0's parameters and buffers, as DDP does when it wraps a model. fully_shard
    keeps each process's own slice of whatever that process holds, so weights initialised differently per
    process (peft draws LoRA's initial A from the global RNG, which a per-rank seed makes differ) would
    otherwise be stitched together from several initialisations."""
    if world_size() == 1:
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


def fsdp_units(model: nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def generation_context(model: nn.Module) -> Iterator[nn.Module]:
    """Yields the module to call `generate` on, with full parameters in every process (see the module
    docstring). No-op for an unsharded model beyond unwrapping DDP."""
    units = fsdp_units(model)
    if not units:
        yield model.module if isinstance(model, DistributedDataParallel) else model
        return
    policies = [_reshard_policy(unit) for unit in units]
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


def _forward_records(units: list[FSDPModule]) -> list[tuple[list[Any], int]]:
    """FSDP2 records every forward of a unit, no-grad ones included, in lists that only a backward clears
    (the order its backward prefetches all-gathers in). Forwards inside generation_context never get a
    backward, and processes make different numbers of them (dynamic sampling, uneven shares): left in the
    lists they would make the processes' next backwards prefetch in different orders, i.e. issue
    mismatched collectives (a hang, seen in the engine). The lists and their lengths on entry, so the
    context can drop what it added (torch-internal attributes: torch 2.11–2.13 checked)."""
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
                if record is not None and not any(
                    seen is record for seen, _ in records
                ):  # one shared order list per model
                    records.append((record, len(record)))
    return records


def _forget_forwards_since(records: list[tuple[list[Any], int]]) -> None:
    for record, length in records:
        del record[length:]


def _reshard_policy(unit: FSDPModule) -> bool:
    # torch has no public getter for the policy a unit was given, so wrap_model records it.
    return _RESHARD_AFTER_FORWARD.get(cast(nn.Module, unit), True)


# --- what a process holds ---------------------------------------------------------------------------------


def local_numel(tensor: torch.Tensor) -> int:
    """Elements this process stores for `tensor` (its shard for a DTensor)."""
    return tensor.to_local().numel() if isinstance(tensor, DTensor) else tensor.numel()


def local_bytes(tensor: torch.Tensor) -> int:
    return local_numel(tensor) * tensor.element_size()


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes this process holds of the parameters, their gradients and the optimizer state."""
    params = list(model.parameters())  # tied parameters once
    out = {
        "parameters_bytes": sum(local_bytes(p) for p in params),
        "gradients_bytes": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer_bytes": 0,
    }
    if optimizer is not None:
        for state in optimizer.state.values():
            out["optimizer_bytes"] += sum(
                local_bytes(v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0
            )
    return out
