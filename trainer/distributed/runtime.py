"""The run's processes, as one object: where this process computes, who it is among them, and the few things
done across them (a reduction of host numbers, a barrier, rank 0's value for everyone, the update's
gradient synchronisation and clipping). `Runtime` is the one handle the trainer holds on the process group,
and this module the one place in it that calls torch.distributed's group functions and collectives (the
strategy's sharding and the checkpoints' DCP use torch.distributed's own higher-level machinery).

Joining: the group that torchrun (or a Ray Train worker, which initialised torch.distributed itself) describes
in the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); a group that exists already is joined as
it is, never re-created; a lone process with no such environment gets a one-member group over an
in-memory store, so the same code runs at one process. The backend follows the device: NCCL on CUDA, gloo
on CPU. A launch whose process count is not the spec's nodes × processes_per_node is refused: a job that
asked for 4 processes and got 2 would silently train with half the batch per step otherwise.

`reduce(values, reduction, dtype)` is the one way host numbers (token counts, summed losses, flags) become
the step's global ones: summed or maxed over every process, as a CPU tensor; `Reduce` is its type, which
the code that takes a reduction as an argument names (tests stand in their own).

Gradient synchronisation across micro-batches follows the run's strategy (trainer.distributed.strategy,
made here for the group's size): under ddp `no_sync` defers DDP's all-reduce to the last micro-batch; under
fsdp2 every micro-batch's backward reduce-scatters its gradients into the shards (the sum of the reduced
parts is the reduced sum), so no unsharded gradient is ever kept.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from typing import Any, Literal, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from contract.distributed import DistributedSpec
from trainer.distributed.strategy import make_strategy

Reduction = Literal["sum", "max"]
REDUCTIONS: dict[str, dist.ReduceOp.RedOpType] = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
T = TypeVar("T")


class Reduce(Protocol):
    """A reduction of host numbers over the processes: `values` summed or maxed over every process, as a
    CPU tensor of `dtype` (a process's own values at one process). `Runtime.reduce` is the one there is."""

    def __call__(
        self, values: float | Sequence[float], reduction: Reduction, dtype: torch.dtype, /
    ) -> Tensor: ...


def pick_device() -> torch.device:
    """This process's device: its local GPU (LOCAL_RANK, set by torchrun and Ray Train) or the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _join_group(spec: DistributedSpec, device: torch.device) -> tuple[int, int]:
    """Joins (or creates) the job's process group; returns (rank, world size). Refuses a launch whose world
    size differs from the spec's."""
    if not dist.is_initialized():
        if "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend_for(device))
        else:
            # One process, no launcher: a one-member group over an in-memory store (no port to pick).
            dist.init_process_group(backend_for(device), store=dist.HashStore(), rank=0, world_size=1)
    world = dist.get_world_size()
    if world != spec.world_size:
        raise ValueError(
            f"distributed: the launcher started {world} processes but the spec asks for "
            f"nodes × processes_per_node = {spec.nodes} × {spec.processes_per_node} = {spec.world_size}"
        )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return dist.get_rank(), world


class Runtime:
    """This process among the run's processes: `rank`, `world_size`, `device`, the run's `strategy`, and
    what is done across the processes (`reduce`, `barrier`, `broadcast_object`, and the update's
    `backward`, `no_sync`, `clip_grad_norm_`)."""

    def __init__(self, spec: DistributedSpec, device: torch.device | None = None) -> None:
        self.spec = spec
        self.device = device if device is not None else pick_device()
        self.rank, self.world_size = _join_group(spec, self.device)
        self.strategy = make_strategy(spec, self.device, self.world_size)

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes what is written once (events, the report, rank-0 files)."""
        return self.rank == 0

    def reduce(
        self,
        values: float | Sequence[float],
        reduction: Reduction = "sum",
        dtype: torch.dtype = torch.float64,
    ) -> Tensor:
        """`values` summed (or maxed) over the processes, as a CPU tensor of `dtype`. The tensor travels on
        this process's device (NCCL reduces CUDA tensors only)."""
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
        tensor = torch.tensor(values, dtype=dtype, device=self.device)
        if self.world_size > 1:
            dist.all_reduce(tensor, op=REDUCTIONS[reduction])
        return tensor.cpu()

    def barrier(self) -> None:
        """Every process waits here until all have come."""
        if self.world_size > 1:
            dist.barrier()

    def broadcast_object(self, value: T) -> T:
        """Rank 0's `value`, on every process."""
        if self.world_size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

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
