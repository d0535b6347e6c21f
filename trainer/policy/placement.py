"""Where the policy lives: loading it, preparing it for training, its checkpoint save and restore, and the
KL reference policy. How the model is laid out over the processes is the run's strategy
(trainer.distributed.strategy, held by the Runtime); these functions ask it:
- `load_policy`: the model and tokenizer, from the spec's source or a checkpoint, LoRA applied, aligned; a
  checkpoint of DCP shards is read once, into a model built on the meta device (no weights loaded first);
- `start_fill`: where a fresh fsdp2 run's shards come from above one process (each process reads its own
  from the safetensors files, or rank 0 loads the model and fills the others');
- `prepare_for_training`: the strategy's `prepare` (DDP, or FSDP2's per-decoder-layer `fully_shard`;
  activation checkpointing; the precision policy) and then the optimiser, built on the prepared (sharded)
  parameters;
- `save_training_state` / `restore_training_state`: a checkpoint of the model, optimiser, scheduler, RNG
  and the engine's state, and its restore (under fsdp2 a sharded one every process writes, with a
  consolidated Hugging Face `model/` folder inside; restored at any world size and strategy);
- `ReferencePolicy`: π_ref, the policy as RL starts, frozen (optim.kl_beta > 0).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from contract.catalog import TINY_ARITH
from contract.protocol import CHECKPOINTS_DIR
from contract.spec import TrainSpec
from contract.storage import storage_writes
from trainer import checkpoints
from trainer.distributed import export_adapter, export_hf_folder, load_sharded, save_sharded
from trainer.distributed.checkpoint import CONFIG_DIR, SHARDS_DIR
from trainer.distributed.fsdp import model_state_bytes
from trainer.distributed.runtime import Reduce, Runtime
from trainer.models import apply_lora, load_model_and_tokenizer, model_skeleton, skeleton_of, weights_files
from trainer.policy.scoring import align_tensors, micro_batches, response_stats
from trainer.rollout.batch import Rollout

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
REFERENCE_FILE = Path("reference") / "model.safetensors"


def load_policy(spec: TrainSpec, checkpoint: Path | None, *, skeleton: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer): the spec's model, or a resumed run's checkpoint weights, with LoRA adapters
    (new, or the checkpoint's), every tensor 64-byte aligned (`align_tensors`). A checkpoint of DCP shards
    (any strategy wrote it) gives a model on the meta device: its weights are read once, by
    `restore_training_state`, into the shards the strategy materialised; under LoRA the spec's base model
    with new adapters, which the shards (the adapters only) then overwrite. `skeleton`: a fresh run's model
    built on the meta device too (`trainer.models.skeleton_of`), for a strategy that fills it from the
    weights' files or from rank 0's (`start_fill`)."""
    if spec.model.dtype not in DTYPES:
        raise ValueError(f"model dtype must be one of {', '.join(DTYPES)}, got {spec.model.dtype!r}")
    dtype = DTYPES[spec.model.dtype]
    model: Any
    built = None
    if checkpoint is not None and (checkpoint / SHARDS_DIR).is_dir() and spec.model.lora is None:
        built = model_skeleton(checkpoint / CONFIG_DIR, checkpoint / "model", dtype=dtype)
    elif skeleton and checkpoint is None:
        built = skeleton_of(spec.model.name, dtype=dtype, seed=spec.seed)
        if built is None:
            raise ValueError(f"model.name: no shapes of {spec.model.name!r} without loading its weights")
    if built is not None:
        model, tokenizer = built
        if spec.model.lora is not None:
            lora = spec.model.lora
            model = apply_lora(
                model, r=lora.r, alpha=lora.alpha, dropout=lora.dropout, target_modules=lora.target_modules
            )
        return model, tokenizer
    source = spec.model.name
    # An older run folder's checkpoint (trainer_state.pt, read only) holds the weights as model/ or adapter/.
    older = checkpoint if checkpoint is not None and not (checkpoint / SHARDS_DIR).is_dir() else None
    if older is not None and (older / "model").is_dir() and spec.model.lora is None:
        source = str(older / "model")
    model, tokenizer = load_model_and_tokenizer(source, dtype=dtype, seed=spec.seed)
    if spec.model.lora is not None:
        lora = spec.model.lora
        if older is not None and (older / "adapter").is_dir():
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(older / "adapter"), is_trainable=True)
        else:
            model = apply_lora(
                model, r=lora.r, alpha=lora.alpha, dropout=lora.dropout, target_modules=lora.target_modules
            )
    align_tensors(model)
    return model, tokenizer


@dataclass(frozen=True)
class StartFill:
    """How a fresh run's model gets its weights where the strategy shards it over several processes
    (`start_fill`): `files`, each process reads its own shards from these safetensors files; `from_rank0`,
    rank 0 loads the model and the others' shards are filled from it; neither, every process loads it."""

    files: tuple[Path, ...] = ()
    from_rank0: bool = False

    def skeleton(self, rank: int) -> bool:
        """Whether process `rank` builds the model on the meta device (`load_policy(skeleton=True)`)."""
        return bool(self.files) or (self.from_rank0 and rank != 0)


def start_fill(runtime: Runtime, spec: TrainSpec, checkpoint: Path | None) -> StartFill:
    """Where the strategy shards over several processes (fsdp2 above one) and the run is fresh: each process
    reads its shards from the safetensors files of the weights (SmolLM2, a local HF folder; not with LoRA,
    whose adapters are drawn on rank 0 and broadcast), else rank 0 alone loads the model where its shapes
    are known without its weights (tiny-arith, built in code); elsewhere every process loads it."""
    if checkpoint is not None or not runtime.strategy.fills_from_rank0:
        return StartFill()
    if spec.model.lora is None:
        files = weights_files(spec.model.name)
        if files is not None:
            return StartFill(files=tuple(files))
    known = spec.model.name == TINY_ARITH or skeleton_of(spec.model.name) is not None
    return StartFill(from_rank0=known)


def prepare_for_training(
    runtime: Runtime, model: Any, spec: TrainSpec, *, fill: StartFill = StartFill()
) -> tuple[Any, Any]:
    """(model, optimiser): the model prepared by the run's strategy (runtime.strategy.prepare; `fill`: where
    a meta-device skeleton's shards are filled from, `start_fill`), then AdamW over its trainable
    parameters (under fsdp2 their shards: the optimiser state is sharded with them)."""
    prepared = runtime.strategy.prepare(model, from_rank0=fill.from_rank0, from_files=fill.files)
    params = [p for p in prepared.parameters() if p.requires_grad]
    o = spec.optim
    # fused: one kernel per parameter instead of ~10 elementwise passes over it (docs/BENCHMARKS.md).
    # Deterministic run to run like the single-tensor loop, so resumed runs stay bit-exact; its rounding
    # differs from that loop's in the last bits. It runs on DTensor shards too.
    optimizer = torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, fused=True)
    return prepared, optimizer


def held_bytes(model: Any, optimizer: Any, reduce: Reduce) -> dict[str, float]:
    """The step's memory/ metrics: the parameter, gradient and optimizer bytes this process holds (its
    local shards under fsdp2), and their sum over the processes (`reduce`: collective)."""
    mine = float(sum(model_state_bytes(model, optimizer).values()))
    total = float(reduce(mine, "sum", torch.float64))
    return {"memory/model_state_bytes": mine, "memory/model_state_bytes_all": total}


def save_training_state(
    out: Path,
    step: int,
    *,
    runtime: Runtime,
    model: Any,
    tokenizer: Any,
    optimizer: Any,
    scheduler: Any,
    state: dict[str, Any],
    spec: TrainSpec,
) -> Path | None:
    """Writes OUT/checkpoints/step-N, one format under either strategy (trainer.distributed.save_sharded:
    every process writes its shards; under ddp a replicated tensor once). Collective: every process calls
    it; returns the folder on the main process, None elsewhere. Before the folder is committed the folders
    users download are exported into it, so a step-* folder always holds them: `model/` (consolidated from
    the shards; a LoRA run's when lora.merge_on_save, adapters merged) and, for LoRA, `adapter/`."""
    lora = spec.model.lora

    def export(tmp: Path) -> None:
        if lora is not None:
            export_adapter(model, tmp / "adapter", runtime=runtime, tokenizer=tokenizer)
        if lora is None or lora.merge_on_save:
            export_hf_folder(model, tmp / "model", runtime=runtime, tokenizer=tokenizer)

    folder = checkpoints.checkpoint_dir(out / CHECKPOINTS_DIR, step)
    save_sharded(
        folder, model, optimizer, {**state, "step": step}, runtime=runtime, scheduler=scheduler,
        before_commit=export,
    )  # fmt: skip
    return folder if runtime.is_main else None


def restore_training_state(
    path: Path, model: Any, optimizer: Any, scheduler: Any, *, runtime: Runtime
) -> dict[str, Any]:
    """Restores the optimiser, scheduler and RNG states of the checkpoint at `path` and returns the
    engine's state (state.json). A checkpoint of DCP shards (any world size, any strategy) also restores
    the weights it holds, into whatever `model` is (sharded or not: collective; `load_policy` built it
    without them). An older run folder's checkpoint (trainer_state.pt, read only: nothing writes it now)
    had its weights loaded by `load_policy`; its optimiser state is positional, so it loads only into an
    unsharded model."""
    if (path / SHARDS_DIR).is_dir():
        state = load_sharded(path, model, optimizer, runtime=runtime, scheduler=scheduler)
        if int(state["step"]) == 0:  # saved before any update: its moments are save_sharded's placeholders
            optimizer.state.clear()
        return state
    if runtime.strategy.sharded:
        raise ValueError(
            f"{path.name}: an older checkpoint (trainer_state.pt) does not resume under distributed.strategy "
            "'fsdp2' (its optimizer state is not keyed by parameter)"
        )
    state, trainer_state = checkpoints.load_state(path)
    optimizer.load_state_dict(trainer_state["optimizer"])
    scheduler.load_state_dict(trainer_state["scheduler"])
    checkpoints.set_rng_state(trainer_state["rng"])
    return state


class ReferencePolicy:
    """The KL penalty's reference policy π_ref: the policy as RL starts (after any SFT warm-start), frozen.

    A fresh run writes its weights once to OUT/reference/ (temp file, then rename); a resumed run reads
    them back, so π_ref survives restarts and checkpoint pruning. A LoRA run without SFT needs no copy: its
    adapters start at exactly 0, so π_ref is the policy with its adapters off.
    """

    def __init__(self, policy: Any, spec: TrainSpec, out: Path, runtime: Runtime, *, resumed: bool):
        self.policy, self.spec, self.strategy = policy, spec, runtime.strategy
        self.model: Any = None
        self.adapters_off = spec.model.lora is not None and (spec.sft is None or spec.sft.steps == 0)
        if self.adapters_off:
            return
        from safetensors.torch import load_model, save_model

        path = out / REFERENCE_FILE
        # A copy with full weights (under fsdp2 a fresh model from the gathered full weights, LoRA merged),
        # then laid out like the policy by the strategy, without autograd or activation checkpointing.
        reference = self.strategy.full_copy(policy)
        if resumed:
            if not path.is_file():
                raise FileNotFoundError(f"{path}: the KL reference policy of this run is missing")
            load_model(reference, str(path), device=str(next(reference.parameters()).device))
        elif runtime.is_main:
            tmp = path.with_suffix(".tmp")
            with storage_writes(tmp):
                path.parent.mkdir(parents=True, exist_ok=True)
                save_model(reference, str(tmp))
                os.replace(tmp, path)
        runtime.barrier()
        align_tensors(reference)
        reference.eval()
        reference.requires_grad_(False)
        self.model = self.strategy.prepare(reference, trainable=False)

    def logprob(self, batch: Rollout) -> Tensor:
        """log π_ref of every response token (B, R), without autograd (full weights while it runs)."""
        if self.adapters_off:
            model, off = self.policy, self.policy.disable_adapter()
        else:
            model, off = self.model, contextlib.nullcontext()
        spec = self.spec
        with torch.no_grad(), off, self.strategy.full_weights(model) as full:
            return torch.cat(
                [
                    response_stats(full, batch, idx, spec.sampling.temperature, with_entropy=False)[0]
                    for idx in micro_batches(batch.size, spec.optim.micro_batch_size)
                ]
            )
