"""Run by test_fsdp2_start_fill.py under torchrun (fsdp2 × 2): a local HF folder of safetensors loaded the
old way (rank 0 loads it, the other rank builds a meta-device skeleton, prepare(from_rank0=True) broadcasts)
and the new way (every rank a skeleton, prepare(from_files=...) reads each rank's own slices), in float32
and bfloat16. Each rank writes, per way and dtype, every parameter's full tensor, the logits of a fixed
batch, and the elements the files path read (load_shards_from_files' count), for the test to compare.

    torchrun --nproc-per-node 2 start_fill_worker.py MODEL_FOLDER OUT
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from contract.distributed import DistributedSpec
from trainer.distributed import Runtime, shard_load
from trainer.models import load_model_and_tokenizer, skeleton_of, weights_files

DEVICE = torch.device("cpu")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def main(folder: str, out: Path) -> None:
    spec = DistributedSpec(strategy="fsdp2", processes_per_node=2)
    runtime = Runtime(spec, DEVICE)
    rank = runtime.rank
    counts: list[int] = []
    original = shard_load.load_shards_from_files

    def counted(model: Any, files: Any) -> int:
        counts.append(original(model, files))
        return counts[-1]

    shard_load.load_shards_from_files = counted  # prepare calls it through the module
    files = weights_files(folder)
    assert files is not None
    ids = torch.randint(4, 1000, (2, 12), generator=torch.Generator().manual_seed(5))
    report: dict[str, Any] = {}
    for dtype_name, dtype in DTYPES.items():
        for way in ("rank0", "files"):
            strategy = runtime.strategy
            if way == "rank0" and rank == 0:
                model, _ = load_model_and_tokenizer(folder, dtype=dtype)
            else:
                built = skeleton_of(folder, dtype=dtype)
                assert built is not None
                model = built[0]
            if way == "rank0":
                prepared = strategy.prepare(model, from_rank0=True)
            else:
                prepared = strategy.prepare(model, from_files=files)
            with torch.no_grad(), strategy.full_weights(prepared) as full:
                logits = full(input_ids=ids).logits
            report[f"{way}-{dtype_name}"] = {
                "state": {name: tensor.clone() for name, tensor in strategy.full_state(prepared)},
                "buffers": {name: b.detach().clone() for name, b in prepared.named_buffers()},
                "logits": logits.clone(),
                "local_elements": sum(p.to_local().numel() for p in prepared.parameters()),
            }
        if rank == 0:
            plain, _ = load_model_and_tokenizer(folder, dtype=dtype)
            report[f"plain-{dtype_name}"] = {
                "state": {name: tensor.detach().clone() for name, tensor in plain.state_dict().items()},
                "logits": plain(input_ids=ids).logits.detach(),
            }
    report["read_elements"] = counts
    torch.save(report, out / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
