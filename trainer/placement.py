"""Where the policy lives: loading it, wrapping it for training, its checkpoint save and restore, and the
KL reference policy. Each is behind one function, so a sharded wrapping (FSDP2) lands here alone:
- `load_policy`: the model and tokenizer, from the spec's source or a checkpoint, LoRA applied, aligned;
- `wrap_for_training`: the optimiser and the process-group wrapping (accelerate's DDP today);
- `save_training_state` / `restore_training_state`: a checkpoint of the unwrapped model, optimiser,
  scheduler, RNG and the engine's state, and its restore;
- `ReferencePolicy`: π_ref, the policy as RL starts, frozen (optim.kl_beta > 0).
"""

from __future__ import annotations

import contextlib
import copy
import os
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import Tensor

from contract.protocol import CHECKPOINTS_DIR
from contract.spec import TrainSpec
from contract.storage import storage_writes
from trainer import checkpoints
from trainer.models import apply_lora, load_model_and_tokenizer
from trainer.rollout import Rollout
from trainer.scoring import align_tensors, micro_batches, response_stats

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
REFERENCE_FILE = Path("reference") / "model.safetensors"


def load_policy(spec: TrainSpec, checkpoint: Path | None) -> tuple[Any, Any]:
    """(model, tokenizer): the spec's model, or a resumed run's checkpoint weights, with LoRA adapters
    (new, or the checkpoint's), every tensor 64-byte aligned (`align_tensors`)."""
    if spec.model.dtype not in DTYPES:
        raise ValueError(f"model dtype must be one of {', '.join(DTYPES)}, got {spec.model.dtype!r}")
    source = spec.model.name
    if checkpoint is not None and (checkpoint / "model").is_dir() and spec.model.lora is None:
        source = str(checkpoint / "model")
    model: Any
    model, tokenizer = load_model_and_tokenizer(source, dtype=DTYPES[spec.model.dtype], seed=spec.seed)
    if spec.model.lora is not None:
        lora = spec.model.lora
        if checkpoint is not None and (checkpoint / "adapter").is_dir():
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(checkpoint / "adapter"), is_trainable=True)
        else:
            model = apply_lora(
                model, r=lora.r, alpha=lora.alpha, dropout=lora.dropout, target_modules=lora.target_modules
            )
    align_tensors(model)
    return model, tokenizer


def wrap_for_training(accelerator: Accelerator, model: Any, spec: TrainSpec) -> tuple[Any, Any, Any]:
    """(wrapped model, optimiser, unwrapped model): AdamW over the trainable parameters, and the model
    wrapped for the process group. The unwrapped model is what generation and saving use."""
    params = [p for p in model.parameters() if p.requires_grad]
    o = spec.optim
    # fused: one kernel per parameter instead of ~10 elementwise passes over it (docs/BENCHMARKS.md).
    # Deterministic run to run like the single-tensor loop, so resumed runs stay bit-exact; its rounding
    # differs from that loop's in the last bits.
    optimizer = torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, fused=True)
    wrapped, optimizer = accelerator.prepare(model, optimizer)
    # unwrap_model has a cost per call: taken once.
    return wrapped, optimizer, accelerator.unwrap_model(wrapped)


def save_training_state(
    out: Path,
    step: int,
    *,
    accelerator: Accelerator,
    model: Any,
    tokenizer: Any,
    optimizer: Any,
    scheduler: Any,
    state: dict[str, Any],
    spec: TrainSpec,
) -> Path:
    """Writes OUT/checkpoints/step-N (main process only; the caller waits for the others)."""
    lora = spec.model.lora
    return checkpoints.save_checkpoint(
        out / CHECKPOINTS_DIR,
        step,
        model=accelerator.unwrap_model(model),
        tokenizer=tokenizer,
        optimizer=optimizer,
        scheduler=scheduler,
        state=state,
        is_lora=lora is not None,
        merge_lora=lora is not None and lora.merge_on_save,
    )


def restore_training_state(path: Path, optimizer: Any, scheduler: Any) -> dict[str, Any]:
    """Loads the optimiser, scheduler and RNG states of the checkpoint at `path` (the weights were loaded
    by `load_policy`); returns the engine's state (state.json)."""
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

    def __init__(self, policy: Any, spec: TrainSpec, out: Path, accelerator: Accelerator, *, resumed: bool):
        self.policy, self.spec = policy, spec
        self.model: Any = None
        self.adapters_off = spec.model.lora is not None and (spec.sft is None or spec.sft.steps == 0)
        if self.adapters_off:
            return
        from safetensors.torch import load_model, save_model

        path = out / REFERENCE_FILE
        reference = copy.deepcopy(policy)
        if resumed:
            if not path.is_file():
                raise FileNotFoundError(f"{path}: the KL reference policy of this run is missing")
            load_model(reference, str(path), device=str(accelerator.device))
        elif accelerator.is_main_process:
            tmp = path.with_suffix(".tmp")
            with storage_writes(tmp):
                path.parent.mkdir(parents=True, exist_ok=True)
                save_model(reference, str(tmp))
                os.replace(tmp, path)
        accelerator.wait_for_everyone()
        align_tensors(reference)
        reference.eval()
        reference.requires_grad_(False)
        self.model = reference

    def logprob(self, batch: Rollout) -> Tensor:
        """log π_ref of every response token (B, R), without autograd."""
        if self.adapters_off:
            model, off = self.policy, self.policy.disable_adapter()
        else:
            model, off = self.model, contextlib.nullcontext()
        spec = self.spec
        with torch.no_grad(), off:
            return torch.cat(
                [
                    response_stats(model, batch, idx, spec.sampling.temperature, with_entropy=False)[0]
                    for idx in micro_batches(batch.size, spec.optim.micro_batch_size)
                ]
            )
