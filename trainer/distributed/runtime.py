"""The engine's view of the process group: where this process computes, who it is, and the few collective
operations the training loop needs (reductions of host numbers, gradient clipping, barriers).

`Runtime` is what the engine, the update and the SFT warm-start talk to, whatever the strategy: it joins
the group the launcher described (torchrun, or a Ray Train worker that initialised torch.distributed
itself: `init_process_group` joins a group that exists, it never re-creates one), or makes a one-member
group for a lone process. It holds the run's `strategy` (trainer.distributed.strategy:
how the model is laid out over the processes), and the update's gradient synchronisation and clipping
follow it.

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

from contract.distributed import DistributedSpec
from trainer.distributed.process_group import barrier, init_process_group
from trainer.distributed.strategy import make_strategy

REDUCTIONS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}


class Collective(Protocol):
    """What the update and SFT code need of the process group (a Runtime; tests stand in their own)."""

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
        self.strategy = make_strategy(spec, self.device)

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
        """Gradients of the micro-batches in this block are not synchronised yet (strategy.no_sync)."""
        return self.strategy.no_sync(model)

    def clip_grad_norm_(self, parameters: Iterable[torch.nn.Parameter], max_norm: float) -> Tensor:
        """Clips the gradients to a global norm ≤ max_norm; returns the norm before clipping. Under fsdp2
        each process holds a shard of every gradient: the norm is reduced over all of them."""
        params = [p for p in parameters if p.grad is not None]
        total = self.strategy.grad_norm([p.grad for p in params if p.grad is not None])
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return total

    def wait_for_everyone(self) -> None:
        barrier()
