"""Training over several processes and machines: process group, DDP/FSDP2 wrapping, sharded checkpoints.

The engine's wiring is a few calls (docs/DISTRIBUTED.md):

    rank, world = init_process_group(spec.distributed, device)
    model = wrap_model(model, spec.distributed, device)          # before building the optimizer
    with generation_context(model) as generator: ...generate...  # rollouts with full parameters
    save_sharded(checkpoint_dir(root, step), model, optimizer, state, scheduler=scheduler)
    state = load_sharded(folder, model, optimizer, scheduler=scheduler)   # at any world size
    export_hf_folder(model_or_checkpoint_folder, out_dir, tokenizer=tokenizer)
"""

from trainer.distributed.checkpoint import export_hf_folder, load_sharded, save_sharded
from trainer.distributed.fsdp import decoder_layers, generation_context, model_state_bytes, wrap_model
from trainer.distributed.process_group import (
    all_reduce_mean,
    all_reduce_sum,
    barrier,
    init_process_group,
    rank,
    world_size,
)

__all__ = [
    "all_reduce_mean",
    "all_reduce_sum",
    "barrier",
    "decoder_layers",
    "export_hf_folder",
    "generation_context",
    "init_process_group",
    "load_sharded",
    "model_state_bytes",
    "rank",
    "save_sharded",
    "world_size",
    "wrap_model",
]
