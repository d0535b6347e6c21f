"""The run's checkpoint folders: names, listing, pruning, RNG states, and the older layout, read only.

OUT/checkpoints/step-000050/ is written by trainer.distributed.checkpoint under either strategy (DCP shards,
RNG states, state.json) with the folders users download exported into it (trainer.policy.placement): `model/`
(from_pretrained loads it; a LoRA run's when lora.merge_on_save, adapters merged) and `adapter/` (LoRA).
A folder named step-* exists only once complete (rename is atomic), so "latest" is the highest step. The
name is contract.protocol's (checkpoint_name, checkpoint_step): the worker reads the same folders.

Run folders written before that hold the older layout, which is still read (`load_state`; resumed only
under ddp, its optimiser state being positional): model/ or adapter/, trainer_state.pt (optimiser,
scheduler, RNG states) and state.json.

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
from typing import Any

import numpy as np
import torch

from contract.protocol import checkpoint_name, checkpoint_step


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
    """(state.json, trainer_state.pt) of a checkpoint folder of the older layout."""
    state = json.loads((path / "state.json").read_text())
    trainer_state = torch.load(path / "trainer_state.pt", weights_only=False, map_location="cpu")
    return state, trainer_state
