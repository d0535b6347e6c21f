"""What a process holds of the model under either strategy: its local elements and bytes of every
parameter (its shard of a DTensor under fsdp2), gradient and optimizer state (the step's memory/ metrics,
bench/bench_fsdp.py). How the model is laid out is trainer.distributed.strategy's.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor


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
