"""Checkpoints: a Hugging Face folder plus the trainer state, written to a temp dir and renamed atomically.

Layout of OUT/checkpoints/step-000050/:
  model/              safetensors + config + tokenizer (from_pretrained loads it; merged weights for LoRA
                      runs when lora.merge_on_save, else absent)
  adapter/            LoRA adapters as peft saves them (LoRA runs only)
  trainer_state.pt    optimiser, scheduler, RNG states
  state.json          step, data cursor, STARE controller state, entropy-band counter, metadata
A folder named step-* exists only once complete (rename is atomic), so "latest" is the highest step. The
name is contract.protocol's (checkpoint_name, checkpoint_step): the worker reads the same folders.

A failed write (a full or read-only disk, an I/O error) removes the temp folder and raises
contract.storage.StorageError: the previous checkpoints stay as they were, and no `checkpoint` event is
emitted, so the worker never records a half-written folder.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import torch

from contract.protocol import checkpoint_name, checkpoint_step
from contract.storage import fsync_dir, fsync_tree, storage_writes


def checkpoint_dir(root: Path, step: int) -> Path:
    return root / checkpoint_name(step)


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint under root, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        step = checkpoint_step(child.name)
        if step is not None and child.is_dir() and (child / "state.json").is_file():
            found.append((step, child))
    return sorted(found)


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: dict[str, Any],
    is_lora: bool,
    merge_lora: bool,
) -> Path:
    final = checkpoint_dir(root, step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    try:
        with storage_writes(tmp):
            root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
            _write(tmp, model, tokenizer, optimizer, scheduler, {**state, "step": step}, is_lora, merge_lora)
            fsync_tree(tmp)
            replace_folder(tmp, final)
            fsync_dir(root)  # the rename itself survives a power cut
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a half-written folder never lingers (nor fills the disk)
        raise
    return final


def _write(
    folder: Path,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: dict[str, Any],
    is_lora: bool,
    merge_lora: bool,
) -> None:
    if is_lora:
        model.save_pretrained(folder / "adapter")
        if merge_lora:
            from trainer.distributed.strategy import plain_copy

            merged = plain_copy(model)  # the adapters merged into a copy; the training model keeps its own
            merged.save_pretrained(folder / "model", safe_serialization=True)
            tokenizer.save_pretrained(folder / "model")
        tokenizer.save_pretrained(folder / "adapter")
    else:
        model.save_pretrained(folder / "model", safe_serialization=True)
        tokenizer.save_pretrained(folder / "model")
    with open(folder / "trainer_state.pt", "wb") as fh:
        out = _ErrnoKeepingFile(fh)
        try:
            torch.save(
                {
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "rng": rng_state(),
                },
                cast(BinaryIO, out),  # torch.save needs only write() and flush()
            )
        except Exception as err:
            if out.error is not None:
                raise out.error from err
            raise
    (folder / "state.json").write_text(json.dumps(state, indent=2, sort_keys=True))  # last: marks it complete


class _ErrnoKeepingFile:
    """A file for torch.save that remembers its first failed write. torch turns the OSError of a write
    (ENOSPC, EIO) into a RuntimeError about stream positions, losing the errno the worker needs."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.fh.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def flush(self) -> None:
        try:
            self.fh.flush()
        except OSError as err:
            self.error = self.error or err
            raise


def replace_folder(tmp: Path, final: Path) -> None:
    """Renames tmp to final. A folder already at final (the same step redone after a resume) is moved aside
    first and removed after, so a failure on the way never leaves final half-deleted."""
    aside = None
    if final.exists():
        aside = final.parent / f".tmp-replaced-{final.name}-{os.getpid()}"
        if aside.exists():
            shutil.rmtree(aside)
        os.replace(final, aside)
    os.replace(tmp, final)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def prune(root: Path, keep_last: int) -> list[int]:
    """Deletes all but the newest `keep_last` checkpoints (and stale temp folders); returns deleted steps."""
    found = list_checkpoints(root)
    deleted = []
    for step, path in found[: max(0, len(found) - keep_last)]:
        shutil.rmtree(path, ignore_errors=True)
        deleted.append(step)
    for stale in root.glob(".tmp-*"):
        if stale.is_dir() and not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)
    return deleted


def load_state(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state.json, trainer_state.pt) of a checkpoint folder."""
    state = json.loads((path / "state.json").read_text())
    trainer_state = torch.load(path / "trainer_state.pt", weights_only=False, map_location="cpu")
    return state, trainer_state
