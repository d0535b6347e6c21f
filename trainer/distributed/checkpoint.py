"""Sharded checkpoints (torch.distributed.checkpoint) that resume at any number of processes.

Layout of OUT/checkpoints/step-000050/ (the name is contract.protocol's, as for trainer/checkpoints.py, so
its list_checkpoints, latest_checkpoint and prune work on these folders too):
  sharded/            DCP files: every process writes its own shards (`__R_0.distcp`), rank 0 `.metadata`;
                      model, optimizer (keyed by parameter name, not by position) and scheduler
  rng/rank-00000.pt   each process's RNG states (python, numpy, torch, cuda)
  model_config/       the HF config (and peft's adapter_config.json for LoRA), for export without the job
  distributed.json    world size and strategy it was written at (information: loading reshards freely)
  state.json          the caller's extra state (step, data cursor, controller state); written last
Every process writes (and fsyncs) its part into one temp folder `.tmp-step-000050-PID` (rank 0's pid); after
all report success rank 0 writes state.json and renames the folder into place, so a step-* folder exists
only once complete. A failure on any process removes the temp folder on rank 0 and raises on every
process; storage faults leave as contract.storage.StorageError, as for the single-process checkpoints.
The folder must be on storage every process sees (a shared file system across nodes).

Loading reads the shards whatever world size wrote them: DCP maps each saved shard onto the shards (or the
whole tensors) the loading processes hold, by parameter name and offset. A process whose rank did not
exist at save time takes rank 0's RNG states, as a fresh run seeds every rank alike.

`export_hf_folder` consolidates a live (sharded) model or a checkpoint folder into a Hugging Face folder
(safetensors + config) that from_pretrained loads; a LoRA model is exported with its adapters merged.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from contract.storage import fsync_dir, fsync_tree, storage_writes
from trainer.checkpoints import replace_folder, rng_state, set_rng_state
from trainer.distributed.hf_folder import write_folder, write_weights
from trainer.distributed.process_group import all_reduce_sum, barrier, broadcast_object, rank, world_size
from trainer.distributed.strategy import full_state, hf_model, peft_config_of

SHARDS_DIR = "sharded"
RNG_DIR = "rng"
CONFIG_DIR = "model_config"
LAYOUT_FILE = "distributed.json"
STATE_FILE = "state.json"
ADAPTER_CONFIG = "adapter_config.json"


def rng_file(rank_index: int) -> str:
    return f"rank-{rank_index:05d}.pt"


def save_sharded(
    folder: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extra_state: dict[str, Any],
    *,
    scheduler: Any = None,
    before_commit: Callable[[Path], None] | None = None,
    strategy: str,
) -> Path:
    """Writes the checkpoint `folder` (e.g. trainer.checkpoints.checkpoint_dir(root, step)) from every
    process; returns it once committed. Collective: every process calls it with its own model.
    `before_commit(tmp)` (collective, optional) adds to the temp folder after the shards are written and
    before the commit (the engine exports the consolidated HF folder `model/` there); a failure in it on
    any process aborts the checkpoint like a failed shard write. `strategy`: the one it was written under
    (recorded in distributed.json, for information)."""
    folder = Path(folder)
    tmp = Path(str(broadcast_object(str(folder.parent / f".tmp-{folder.name}-{os.getpid()}"))))
    error: BaseException | None = None
    if rank() == 0:
        try:
            with storage_writes(tmp):
                folder.parent.mkdir(parents=True, exist_ok=True)
                if tmp.exists():
                    shutil.rmtree(tmp)
                (tmp / RNG_DIR).mkdir(parents=True)
        except Exception as err:
            error = err
    _raise_if_any_failed(error, tmp)  # also the barrier: the folder exists before anyone writes into it
    try:
        with storage_writes(tmp):
            _write_shards(tmp, model, optimizer, scheduler)
    except Exception as err:  # reported to the other processes, then raised
        error = err
    _raise_if_any_failed(error, tmp)
    if before_commit is not None:
        try:
            before_commit(tmp)
        except Exception as err:
            error = err
        _raise_if_any_failed(error, tmp)
    if rank() == 0:
        try:
            with storage_writes(tmp):
                _write_rank0_files(tmp, model, extra_state, strategy)
                fsync_tree(tmp)
                replace_folder(tmp, folder)
                fsync_dir(folder.parent)  # the rename itself survives a power cut
        except Exception as err:
            error = err
    _raise_if_any_failed(error, tmp)
    return folder


def _write_shards(tmp: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    fresh = not optimizer.state
    model_state, optimizer_state = get_state_dict(model, optimizer)
    if fresh:
        # get_state_dict fills an empty optimizer's state by running a step at lr 0 (zero moments, and a
        # step count of 1): left in place, the first real AdamW step would be counted as the second (bias
        # correction off by one step: seen as a divergence from ddp after two updates). What was
        # gathered for the file is kept; the live optimizer starts fresh again.
        optimizer.state.clear()
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp / SHARDS_DIR, sync_files=True))
    path = tmp / RNG_DIR / rng_file(rank())
    with open(path, "wb") as fh:
        torch.save(rng_state(), fh)
        fh.flush()
        os.fsync(fh.fileno())


def _write_rank0_files(tmp: Path, model: nn.Module, extra_state: dict[str, Any], strategy: str) -> None:
    _save_model_config(model, tmp / CONFIG_DIR)
    layout = {"world_size": world_size(), "strategy": strategy}
    (tmp / LAYOUT_FILE).write_text(json.dumps(layout, indent=2, sort_keys=True))
    (tmp / STATE_FILE).write_text(
        json.dumps(extra_state, indent=2, sort_keys=True)
    )  # last: marks it complete


def _save_model_config(model: nn.Module, out_dir: Path) -> None:
    inner = hf_model(model)
    inner.config.save_pretrained(out_dir)
    generation_config = getattr(inner, "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(out_dir)
    peft_config = peft_config_of(model)
    if peft_config is not None:
        peft_config.save_pretrained(out_dir)


def _raise_if_any_failed(error: BaseException | None, tmp: Path) -> None:
    """Collective: every process learns whether any failed; then all raise (after rank 0 removed `tmp`)."""
    failed = all_reduce_sum({"failed": 1.0 if error is not None else 0.0})["failed"]
    if failed == 0:
        return
    if rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a half-written folder never lingers (nor fills the disk)
    barrier()
    if error is not None:
        raise error
    raise RuntimeError(f"{tmp.name}: {int(failed)} other process(es) failed to write their part")


def load_sharded(
    folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, *, scheduler: Any = None
) -> dict[str, Any]:
    """Restores model, optimizer, scheduler and this process's RNG from `folder`, written at any world
    size; returns the extra state saved with it. Collective. `model` is wrapped already (wrap_model) and
    `optimizer` built on its parameters."""
    folder = Path(folder)
    if not (folder / STATE_FILE).is_file():
        raise FileNotFoundError(f"{folder} is not a complete sharded checkpoint (no {STATE_FILE})")
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    dcp.load(state, storage_reader=dcp.FileSystemReader(folder / SHARDS_DIR))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    own = folder / RNG_DIR / rng_file(rank())
    set_rng_state(torch.load(own if own.is_file() else folder / RNG_DIR / rng_file(0), weights_only=False))
    return dict(json.loads((folder / STATE_FILE).read_text()))


# --- export -----------------------------------------------------------------------------------------------


def export_hf_folder(source: Path | nn.Module, out_dir: Path, *, tokenizer: Any = None) -> Path | None:
    """A Hugging Face folder at `out_dir` from a live (sharded) model (collective: every process gathers,
    rank 0 writes each tensor as it comes, trainer.distributed.hf_folder, so it never holds the full state)
    or from a sharded checkpoint folder (one process, no process group needed). Returns out_dir on the
    process that wrote it, None on the others."""
    out_dir = Path(out_dir)
    if not isinstance(source, nn.Module):
        return _export_checkpoint(Path(source), out_dir, tokenizer)
    inner = hf_model(source)
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"
    error: BaseException | None = None
    if rank() == 0:
        try:
            _write_hf_folder(out_dir, full_state(source), inner.config, inner.generation_config, tokenizer)
        except Exception as err:
            error = err
    else:
        write_weights(full_state(source), tmp, write=False)  # the gathers rank 0's writer asks for
    _raise_if_any_failed(error, tmp)
    return out_dir if rank() == 0 else None


def _export_checkpoint(folder: Path, out_dir: Path, tokenizer: Any) -> Path:
    from transformers import AutoConfig, GenerationConfig

    config_dir = folder / CONFIG_DIR
    config = AutoConfig.from_pretrained(config_dir)
    generation_config = (
        GenerationConfig.from_pretrained(config_dir)
        if (config_dir / "generation_config.json").is_file()
        else None
    )
    peft_config = None
    if (config_dir / ADAPTER_CONFIG).is_file():
        from peft import PeftConfig

        peft_config = PeftConfig.from_pretrained(str(config_dir))
    model = build_model(config, peft_config)
    state: dict[str, Any] = {"model": model.state_dict()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(folder / SHARDS_DIR), no_dist=True)
    model.load_state_dict(state["model"], strict=True)
    _write_hf_folder(out_dir, full_state(model), config, generation_config, tokenizer)
    return out_dir


def build_model(config: Any, peft_config: Any) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config)
    if peft_config is None:
        return model
    from peft import get_peft_model

    return get_peft_model(model, peft_config)


def _write_hf_folder(
    out_dir: Path,
    weights: Iterable[tuple[str, Tensor]],
    config: Any,
    generation_config: Any,
    tokenizer: Any,
) -> None:
    """`weights`: full tensors in transformers' names, adapters merged (strategy.full_state), written as
    they come into a temp folder that replaces `out_dir` once complete."""
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"
    with storage_writes(tmp):
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            write_folder(
                weights, tmp, config=config, generation_config=generation_config, tokenizer=tokenizer
            )
            fsync_tree(tmp)
            replace_folder(tmp, out_dir)
            fsync_dir(out_dir.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
