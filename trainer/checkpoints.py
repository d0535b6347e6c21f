"""Checkpoints: a Hugging Face folder plus the trainer state, written to a temp dir and renamed atomically.

Layout of OUT/checkpoints/step-000050/:
  model/              safetensors + config + tokenizer (from_pretrained loads it; merged weights for LoRA
                      runs when lora.merge_on_save, else absent)
  adapter/            LoRA adapters as peft saves them (LoRA runs only)
  trainer_state.pt    optimiser, scheduler, RNG states
  state.json          step, data cursor, STARE controller state, entropy-band counter, metadata
A folder named step-* exists only once complete (rename is atomic), so "latest" is the highest step.
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

STEP_PREFIX = "step-"


def checkpoint_dir(root: Path, step: int) -> Path:
    return root / f"{STEP_PREFIX}{step:06d}"


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        if child.is_dir() and child.name.startswith(STEP_PREFIX) and (child / "state.json").is_file():
            try:
                found.append((int(child.name[len(STEP_PREFIX) :]), child))
            except ValueError:
                continue
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


def _fsync_tree(path: Path) -> None:
    for dirpath, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as fh:
                os.fsync(fh.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    root.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir(root, step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    if is_lora:
        model.save_pretrained(tmp / "adapter")
        if merge_lora:
            merged = _merged_copy(model)
            merged.save_pretrained(tmp / "model", safe_serialization=True)
            tokenizer.save_pretrained(tmp / "model")
        tokenizer.save_pretrained(tmp / "adapter")
    else:
        model.save_pretrained(tmp / "model", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "model")
    torch.save(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()},
        tmp / "trainer_state.pt",
    )
    (tmp / "state.json").write_text(json.dumps({**state, "step": step}, indent=2, sort_keys=True))
    _fsync_tree(tmp)
    if final.exists():  # a re-run of the same step after a resume: replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def _merged_copy(model: Any) -> Any:
    """A merged full model from a peft model, leaving the training model's adapters in place."""
    import copy

    return copy.deepcopy(model).merge_and_unload()


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
