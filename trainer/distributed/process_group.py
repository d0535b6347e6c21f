"""The process group a distributed job runs in, and step-global statistics over it.

`init_process_group` joins the group that torchrun (or a Ray worker) describes in the environment (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and checks that it has the size the spec asks for; a lone process
with no such environment gets a one-member group, so the same code runs at one process. The backend
follows the device: NCCL on CUDA, gloo on CPU.

`all_reduce_sum` / `all_reduce_mean` turn per-process figures (token counts, summed losses) into the step's
global ones; without a group they return their input, so the engine calls them unconditionally.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch
import torch.distributed as dist

from contract.distributed import DistributedSpec


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_process_group(spec: DistributedSpec, device: torch.device) -> tuple[int, int]:
    """Joins (or creates) the job's process group; returns (rank, world size).

    Refuses a launch whose world size differs from the spec's nodes × processes_per_node: a job that asked
    for 4 processes and got 2 would silently train with half the batch per step otherwise.
    """
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


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def all_reduce_sum(values: Mapping[str, float]) -> dict[str, float]:
    """Each value summed over the processes (float64, so counts of tokens stay exact)."""
    return _all_reduce(values, mean=False)


def all_reduce_mean(values: Mapping[str, float]) -> dict[str, float]:
    """Each value averaged over the processes (an unweighted mean: weight by counts with all_reduce_sum)."""
    return _all_reduce(values, mean=True)


def _all_reduce(values: Mapping[str, float], *, mean: bool) -> dict[str, float]:
    names = sorted(values)  # the same order on every rank, whatever order each built its dict in
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return {name: float(values[name]) for name in names}
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    packed = torch.tensor([float(values[name]) for name in names], dtype=torch.float64, device=device)
    dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    if mean:
        packed /= dist.get_world_size()
    return dict(zip(names, packed.tolist(), strict=True))


def broadcast_object(value: object) -> object:
    """Rank 0's `value` on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
