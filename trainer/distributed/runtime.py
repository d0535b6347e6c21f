"""The engine's view of the process group: where this process computes, who it is, and the few collective
operations the training loop needs (reductions of host numbers, gradient clipping, barriers).

`Runtime` is what the engine, the update and the SFT warm-start talk to, whatever the strategy: it joins
the group the launcher described (torchrun, or a Ray Train worker that initialised torch.distributed
itself: `init_process_group` joins a group that exists, it never re-creates one), or makes a one-member
group for a lone process. It replaces accelerate's `Accelerator` in the engine: its attribute names are the
ones the engine used of it (`device`, `process_index`, `num_processes`, `is_main_process`, `reduce`,
`backward`, `no_sync`, `clip_grad_norm_`, `wait_for_everyone`, `unwrap_model`), so the update code runs
unchanged under either, and accelerate is no longer needed to launch or wrap (docs/DISTRIBUTED.md).

Gradient synchronisation across micro-batches: under ddp `no_sync` defers DDP's all-reduce to the last
micro-batch, as before; under fsdp2 every micro-batch's backward reduce-scatters its gradients into the
shards (the sum of the reduced parts is the reduced sum), so no unsharded gradient is ever kept.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from contract.distributed import DistributedSpec
from trainer.distributed.process_group import barrier, init_process_group

REDUCTIONS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


class Collective(Protocol):
    """What the update and SFT code need of the process group (Runtime, or accelerate's Accelerator)."""

    @property
    def num_processes(self) -> int: ...

    @property
    def process_index(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    def backward(self, loss: Tensor) -> None: ...

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]: ...

    def clip_grad_norm_(self, parameters: Any, max_norm: float) -> Any: ...


def pick_device() -> torch.device:
    """This process's device: its local GPU (LOCAL_RANK, set by torchrun and Ray Train) or the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


class Runtime:
    def __init__(self, spec: DistributedSpec, device: torch.device | None = None) -> None:
        self.spec = spec
        self.device = device if device is not None else pick_device()
        self.process_index, self.num_processes = init_process_group(spec, self.device)
        self.is_main_process = self.process_index == 0

    @property
    def sharded(self) -> bool:
        return self.spec.strategy == "fsdp2"

    def reduce(self, tensor: Tensor, reduction: str = "sum") -> Tensor:
        """`tensor` summed (or maxed) over the processes; the tensor itself at one process."""
        if self.num_processes == 1:
            return tensor
        out = tensor.clone()
        dist.all_reduce(out, op=REDUCTIONS[reduction])
        return out

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    def clip_grad_norm_(self, parameters: Iterable[torch.nn.Parameter], max_norm: float) -> Tensor:
        """Clips the gradients to a global norm ≤ max_norm; returns the norm before clipping. Under fsdp2
        each process holds a shard of every gradient: the norm is reduced over all of them."""
        params = [p for p in parameters if p.grad is not None]
        grads = [p.grad for p in params if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        if isinstance(total, DTensor):
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total

    def wait_for_everyone(self) -> None:
        barrier()

    @staticmethod
    def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
        """The module under DDP's wrapper (an FSDP2 model is its own module: fully_shard wraps in place)."""
        return model.module if isinstance(model, DistributedDataParallel) else model
