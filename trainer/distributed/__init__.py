"""Training over several processes and machines: process group, the strategy (DDP or FSDP2), the run's
checkpoints (DCP shards under either strategy).

The engine's wiring is a few calls (docs/DISTRIBUTED.md):

    rank, world = init_process_group(spec.distributed, device)
    strategy = make_strategy(spec.distributed, device)
    model = strategy.prepare(model)                              # before building the optimizer
    with strategy.full_weights(model) as full: ...generate...    # rollouts with full parameters
    for name, tensor in strategy.full_state(model): ...          # full tensors, LoRA merged
    save_sharded(checkpoint_dir(root, step), model, optimizer, state, strategy=strategy.name)
    state = load_sharded(folder, model, optimizer, scheduler=scheduler)   # at any world size
    export_hf_folder(model_or_checkpoint_folder, out_dir, tokenizer=tokenizer)
    export_adapter(lora_model, out_dir, tokenizer=tokenizer)    # a LoRA model's adapters, as peft saves them
"""

from trainer.distributed.checkpoint import export_adapter, export_hf_folder, load_sharded, save_sharded
from trainer.distributed.fsdp import model_state_bytes
from trainer.distributed.process_group import (
    all_reduce_mean,
    all_reduce_sum,
    barrier,
    init_process_group,
    rank,
    world_size,
)
from trainer.distributed.strategy import Strategy, make_strategy

__all__ = [
    "Strategy",
    "all_reduce_mean",
    "all_reduce_sum",
    "barrier",
    "export_adapter",
    "export_hf_folder",
    "init_process_group",
    "load_sharded",
    "make_strategy",
    "model_state_bytes",
    "rank",
    "save_sharded",
    "world_size",
]
