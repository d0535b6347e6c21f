"""Training over several processes and machines: the runtime (the process group and the one handle the
trainer holds on it), the strategy (DDP or FSDP2) it makes for the group, the run's checkpoints (DCP shards
under either strategy).

The engine's wiring is a few calls (docs/DISTRIBUTED.md):

    runtime = Runtime(spec.distributed)                          # joins the group; rank, world_size, device
    model = runtime.strategy.prepare(model)                      # before building the optimizer
    with runtime.strategy.full_weights(model) as full: ...       # rollouts with full parameters
    for name, tensor in runtime.strategy.full_state(model): ...  # full tensors, LoRA merged
    tokens = runtime.reduce([local_tokens], "sum", torch.float64)  # host numbers over the processes
    save_sharded(checkpoint_dir(root, step), model, optimizer, state, runtime=runtime)
    state = load_sharded(folder, model, optimizer, runtime=runtime, scheduler=scheduler)  # any world size
    export_hf_folder(model, out_dir, runtime=runtime, tokenizer=tokenizer)  # or from a checkpoint folder
    export_adapter(lora_model, out_dir, runtime=runtime, tokenizer=tokenizer)  # as peft saves adapters
"""

from trainer.distributed.checkpoint import export_adapter, export_hf_folder, load_sharded, save_sharded
from trainer.distributed.fsdp import model_state_bytes
from trainer.distributed.runtime import Reduce, Runtime
from trainer.distributed.strategy import Strategy, make_strategy

__all__ = [
    "Reduce",
    "Runtime",
    "Strategy",
    "export_adapter",
    "export_hf_folder",
    "load_sharded",
    "make_strategy",
    "model_state_bytes",
    "save_sharded",
]
