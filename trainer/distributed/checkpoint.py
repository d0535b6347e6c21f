"""The run's checkpoints (torch.distributed.checkpoint, DCP), under either strategy, resumable at any number
of processes and under either strategy.

Layout of OUT/checkpoints/step-000050/ (the name is contract.protocol's, as for trainer/checkpoints.py, so
its list_checkpoints, latest_checkpoint and prune work on these folders too):
  sharded/            DCP files: every process writes its own shards (`__R_0.distcp`; a tensor replicated
                      on every process, as under ddp, is written once), rank 0 `.metadata`; the trainable
                      weights (a LoRA run: its adapters only, the frozen base is the spec's model), the
                      optimizer (keyed by parameter name, not by position) and the scheduler
  rng/rank-00000.pt   each process's RNG states (python, numpy, torch, cuda)
  model_config/       the HF config (and peft's adapter_config.json for LoRA), for export without the job
  distributed.json    world size and strategy it was written at (information: loading reshards freely)
  state.json          the caller's extra state (step, data cursor, controller state); written last
The caller's `before_commit` adds the folders users download (trainer.policy.placement: `model/`, `adapter/`).
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
`export_adapter` writes a LoRA model's adapters as peft saves them (what `PeftModel.from_pretrained` reads).

DCP reports a failed write as a CheckpointException (a BaseException) holding each process's error; the
error of the write itself (an OSError with its errno: a full or read-only disk) is raised in its place, so
contract.storage classifies it and the temp folder is removed like after any other failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from contract.storage import fsync_dir, fsync_tree, storage_writes
from trainer.checkpoints import replace_folder, rng_state, set_rng_state
from trainer.distributed.hf_folder import write_folder, write_weights
from trainer.distributed.runtime import Runtime
from trainer.distributed.strategy import full_adapter_state, full_state
from trainer.models import adapter_model, hf_model, peft_config_of

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
    runtime: Runtime,
    scheduler: Any = None,
    before_commit: Callable[[Path], None] | None = None,
) -> Path:
    """Writes the checkpoint `folder` (e.g. trainer.checkpoints.checkpoint_dir(root, step)) from every
    process; returns it once committed. Collective: every process calls it with its own model.
    `before_commit(tmp)` (collective, optional) adds to the temp folder after the shards are written and
    before the commit (the engine exports the consolidated HF folder `model/` there); a failure in it on
    any process aborts the checkpoint like a failed shard write. The runtime's strategy and world size are
    recorded in distributed.json, for information."""
    folder = Path(folder)
    tmp = Path(runtime.broadcast_object(str(folder.parent / f".tmp-{folder.name}-{os.getpid()}")))
    error: BaseException | None = None
    if runtime.is_main:
        try:
            with storage_writes(tmp):
                folder.parent.mkdir(parents=True, exist_ok=True)
                if tmp.exists():
                    shutil.rmtree(tmp)
                (tmp / RNG_DIR).mkdir(parents=True)
        except Exception as err:
            error = err
    _raise_if_any_failed(
        runtime, error, tmp
    )  # also the barrier: the folder exists before anyone writes into it
    try:
        with storage_writes(tmp):
            _write_shards(runtime, tmp, model, optimizer, scheduler)
    except Exception as err:  # reported to the other processes, then raised
        error = err
    _raise_if_any_failed(runtime, error, tmp)
    if before_commit is not None:
        try:
            with storage_writes(tmp):
                before_commit(tmp)
        except Exception as err:
            error = err
        _raise_if_any_failed(runtime, error, tmp)
    if runtime.is_main:
        try:
            with storage_writes(tmp):
                _write_rank0_files(runtime, tmp, model, extra_state)
                fsync_tree(tmp)
                replace_folder(tmp, folder)
                fsync_dir(folder.parent)  # the rename itself survives a power cut
        except Exception as err:
            error = err
    _raise_if_any_failed(runtime, error, tmp)
    return folder


def _options(model: nn.Module) -> StateDictOptions:
    """What the shards hold of the model: what training changes. A LoRA model's frozen base is left out (it
    is the spec's model, loaded from there on resume): its adapters only, not a full copy per checkpoint."""
    return StateDictOptions(ignore_frozen_params=peft_config_of(model) is not None)


def _model_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model state, optimizer state) as the shards hold them (`_options`). A LoRA model's tied weights
    (lm_head tied to the embeddings) reach the state under their second name too, which the frozen filter
    misses (it goes by the deduplicated parameters): those are dropped here, frozen under any name."""
    options = _options(model)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    if options.ignore_frozen_params:
        peft_model = adapter_model(model)
        frozen = {n for n, p in peft_model.named_parameters(remove_duplicate=False) if not p.requires_grad}
        model_state = {k: v for k, v in model_state.items() if k not in frozen}
    return model_state, optimizer_state


def _write_error(err: CheckpointException, rank: int) -> BaseException:
    """The error behind DCP's CheckpointException: this process's own, else the lowest rank's."""
    failures = err.failures
    own = failures.get(rank)
    if own is None and failures:
        own = failures[min(failures)]
    return own[0] if own is not None else RuntimeError(str(err))


class _ErrnoKeepingStream:
    """A file DCP writes through that remembers its first failed write: torch.save, which DCP writes each
    tensor with, turns the OSError of a write (ENOSPC, EIO) into a RuntimeError about stream positions,
    losing the errno the worker classifies the fault by."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return int(self._stream.write(data))
        except OSError as err:
            self.error = self.error or err
            raise

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as err:
            self.error = self.error or err
            raise

    def __getattr__(self, name: str) -> Any:  # tell, fileno, seek: the file's own
        return getattr(self._stream, name)


class _ErrnoKeepingFileSystem(FileSystem):
    """DCP's local file system, whose written files raise the first OSError of their writes in place of
    whatever error it caused further up."""

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            with _keeping_errno(stream) as keeping:
                yield keeping


@contextlib.contextmanager
def _keeping_errno(stream: Any) -> Iterator[_ErrnoKeepingStream]:
    """`stream` wrapped to remember its first failed write, which leaves in place of the error it caused."""
    keeping = _ErrnoKeepingStream(stream)
    try:
        yield keeping
    except BaseException as err:
        if keeping.error is not None and keeping.error is not err:
            raise keeping.error from err
        raise


def _writer(path: Path) -> dcp.FileSystemWriter:
    writer = dcp.FileSystemWriter(path, sync_files=True)
    writer.fs = _ErrnoKeepingFileSystem()
    return writer


def _write_shards(
    runtime: Runtime, tmp: Path, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any
) -> None:
    fresh = not optimizer.state
    model_state, optimizer_state = _model_state(model, optimizer)
    if fresh:
        # get_state_dict fills an empty optimizer's state by running a step at lr 0 (zero moments, and a
        # step count of 1): left in place, the first real AdamW step would be counted as the second (bias
        # correction off by one step: seen as a divergence from ddp after two updates). What was
        # gathered for the file is kept; the live optimizer starts fresh again.
        optimizer.state.clear()
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    try:
        dcp.save(state, storage_writer=_writer(tmp / SHARDS_DIR))
    except CheckpointException as err:
        raise _write_error(err, runtime.rank) from None
    path = tmp / RNG_DIR / rng_file(runtime.rank)
    with open(path, "wb") as fh:
        with _keeping_errno(fh) as keeping:
            torch.save(rng_state(), keeping)
        fh.flush()
        os.fsync(fh.fileno())


def _write_rank0_files(runtime: Runtime, tmp: Path, model: nn.Module, extra_state: dict[str, Any]) -> None:
    _save_model_config(model, tmp / CONFIG_DIR)
    layout = {"world_size": runtime.world_size, "strategy": runtime.strategy.name}
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


def _raise_if_any_failed(runtime: Runtime, error: BaseException | None, tmp: Path) -> None:
    """Collective: every process learns whether any failed; then all raise (after rank 0 removed `tmp`)."""
    failed = float(runtime.reduce([1.0 if error is not None else 0.0], "sum", torch.float64)[0])
    if failed == 0:
        return
    if runtime.is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # a half-written folder never lingers (nor fills the disk)
    runtime.barrier()
    if error is not None:
        raise error
    raise RuntimeError(f"{tmp.name}: {int(failed)} other process(es) failed to write their part")


def load_sharded(
    folder: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    runtime: Runtime,
    scheduler: Any = None,
) -> dict[str, Any]:
    """Restores model, optimizer, scheduler and this process's RNG from `folder`, written at any world
    size under either strategy; returns the extra state saved with it. Collective. `model` is prepared
    already (Strategy.prepare) and `optimizer` built on its parameters; a LoRA model holds its base
    weights already (the shards have its adapters only)."""
    folder = Path(folder)
    if not (folder / STATE_FILE).is_file():
        raise FileNotFoundError(f"{folder} is not a complete sharded checkpoint (no {STATE_FILE})")
    options = _options(model)
    model_state, optimizer_state = _model_state(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    dcp.load(state, storage_reader=dcp.FileSystemReader(folder / SHARDS_DIR))
    # DCP filled every key asked for (a key the files lack fails the load); under LoRA the frozen base is not
    # among them, so setting the model's state is not strict about the keys left out.
    lora = options.ignore_frozen_params
    setting = StateDictOptions(ignore_frozen_params=lora, strict=not lora)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=setting,
    )
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    own = folder / RNG_DIR / rng_file(runtime.rank)
    set_rng_state(torch.load(own if own.is_file() else folder / RNG_DIR / rng_file(0), weights_only=False))
    return dict(json.loads((folder / STATE_FILE).read_text()))


# --- export -----------------------------------------------------------------------------------------------


def export_hf_folder(
    source: Path | nn.Module, out_dir: Path, *, runtime: Runtime | None = None, tokenizer: Any = None
) -> Path | None:
    """A Hugging Face folder at `out_dir` from a live (sharded) model (collective: every process gathers,
    rank 0 writes each tensor as it comes, trainer.distributed.hf_folder, so it never holds the full state)
    or from a sharded checkpoint folder (one process, no process group needed: no `runtime`). Returns out_dir
    on the process that wrote it, None on the others."""
    out_dir = Path(out_dir)
    if not isinstance(source, nn.Module):
        if runtime is not None:
            raise ValueError(
                "export_hf_folder: a checkpoint folder is exported by one process, without a runtime"
            )
        return _export_checkpoint(Path(source), out_dir, tokenizer)
    if runtime is None:
        raise ValueError("export_hf_folder: a live model is exported by every process: give the runtime")
    inner = hf_model(source)
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"
    error: BaseException | None = None
    if runtime.is_main:
        try:
            _write_hf_folder(out_dir, full_state(source), inner.config, inner.generation_config, tokenizer)
        except Exception as err:
            error = err
    else:
        write_weights(full_state(source), tmp, write=False)  # the gathers rank 0's writer asks for
    _raise_if_any_failed(runtime, error, tmp)
    return out_dir if runtime.is_main else None


def export_adapter(
    model: nn.Module, out_dir: Path, *, runtime: Runtime, tokenizer: Any = None
) -> Path | None:
    """A LoRA model's adapters at `out_dir` as peft saves them (adapter_config.json, adapter_model.safetensors,
    and the tokenizer when given): collective, every process gathers its adapter shards, rank 0 writes (the
    adapters are small). Returns out_dir on the process that wrote it, None on the others."""
    peft_model = adapter_model(model)
    if peft_model is None:
        raise ValueError("export_adapter: the model has no LoRA adapters")
    adapters = full_adapter_state(model)  # rank 0 holds them, the others an empty dict
    if not runtime.is_main:
        return None

    def write(tmp: Path) -> None:
        peft_model.save_pretrained(tmp, state_dict=adapters, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)

    _write_folder_atomically(out_dir, write)
    return out_dir


def _write_folder_atomically(out_dir: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` fills a temp folder beside `out_dir`, which then replaces `out_dir` (fsynced); a failure
    removes the temp folder (a storage fault leaves as contract.storage.StorageError)."""
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"
    with storage_writes(tmp):
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            write(tmp)
            fsync_tree(tmp)
            replace_folder(tmp, out_dir)
            fsync_dir(out_dir.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


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

        if not _holds_frozen_weights(folder):
            raise ValueError(
                f"{folder.name}: a LoRA checkpoint's shards hold its adapters only; its merged model is the "
                "checkpoint's model/ (model.lora.merge_on_save), its adapters adapter/"
            )
        peft_config = PeftConfig.from_pretrained(str(config_dir))  # an older folder: the base is in it
    model = build_model(config, peft_config)
    state: dict[str, Any] = {"model": model.state_dict()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(folder / SHARDS_DIR), no_dist=True)
    model.load_state_dict(state["model"], strict=True)
    _write_hf_folder(out_dir, full_state(model), config, generation_config, tokenizer)
    return out_dir


def _holds_frozen_weights(folder: Path) -> bool:
    """Whether a LoRA checkpoint's shards hold its base weights too (written before the shards kept the
    adapters only)."""
    metadata = dcp.FileSystemReader(folder / SHARDS_DIR).read_metadata().state_dict_metadata
    return any(key.startswith("model.") and ".lora_" not in key for key in metadata)


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

    def write(tmp: Path) -> None:
        write_folder(weights, tmp, config=config, generation_config=generation_config, tokenizer=tokenizer)

    _write_folder_atomically(out_dir, write)
