"""Checkpoint archives on the client's side: choosing a checkpoint, verifying and unpacking the download,
and the folder `from_pretrained` loads.

The download is a tar of one folder, `<job id>-step-NNNNNN/` (service/storage.py), holding the trainer's
checkpoint (trainer/checkpoints.py):

    model/              a Hugging Face model (full fine-tuning; for LoRA only with lora.merge_on_save, merged)
    adapter/            the LoRA adapter as peft saves it (LoRA jobs)
    sharded/, rng/, model_config/, distributed.json
                        the trainer's own resume state: weights (LoRA: adapters), optimiser and scheduler
                        as torch.distributed.checkpoint shards, RNG states (older jobs: trainer_state.pt)
    state.json          step, data cursor, controller state

Nothing is left half-done: the archive goes to a hidden sibling of the target (`.<name>.partial-*`), its
SHA-256 and size are checked against what the server announced, it is unpacked there within the client's
limits (stare_client.unpack: sizes, ratio, members, links, devices, absolute paths and `..`), a local merge
(if asked for) is written there too, and only then is the folder renamed to the target. An interrupted download leaves at most the hidden partial folder, which the
next attempt removes; never a folder under the target's name.

`merged=True`: a checkpoint with model/ (full fine-tuning, or LoRA with merge_on_save) needs nothing more.
A LoRA checkpoint with only adapter/ is merged here, into merged/, when peft (and so transformers) is
importable and the base model is known: `base_model=` a loaded model, a folder or a hub id, else the
adapter's `base_model_name_or_path`. Otherwise MergeUnavailable says why. A built-in base the trainer
builds in code (tiny-arith) has no such name: pass it as `base_model`, or submit the job with
`model.lora.merge_on_save: true`. The client never imports transformers itself (an import-layer rule);
peft loads the base.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from stare_client import errors
from stare_client.models import Checkpoint, Report
from stare_client.unpack import ArchiveLimits as ArchiveLimits  # unpacking lives in stare_client.unpack
from stare_client.unpack import safe_extract as safe_extract

Selector = Literal["latest", "best"] | int | str
JOB_ID = re.compile(r"job_[0-9A-HJKMNP-TV-Z]{26}")
"""A job id as the server mints it (store/ids.py): the only text a default download folder's name is built
from, so a listing cannot name a folder elsewhere ("../x", "/abs", a path separator)."""
MODEL_DIR, ADAPTER_DIR, MERGED_DIR = "model", "adapter", "merged"


@dataclass(frozen=True)
class DownloadedCheckpoint:
    """A checkpoint on disk. `path` is the folder to give `from_pretrained`: model/ for a full model (or a
    merged LoRA model), adapter/ for a LoRA adapter (`PeftModel.from_pretrained(base, path)`), merged/ for a
    model merged here."""

    root: Path
    path: Path
    kind: Literal["model", "adapter", "merged"]
    job_id: str
    checkpoint_id: str
    step: int
    sha256: str

    def __fspath__(self) -> str:
        return str(self.path)


# ---------------------------------------------------------------------------------------------- selection


def select(checkpoints: list[Checkpoint], which: Selector, report: Report | None = None) -> Checkpoint:
    """The checkpoint `which` names: "latest" (highest step), "best" (highest held-out avg@k among steps that
    have both a checkpoint and an evaluation; the later step on a tie; needs the job's report), a step
    number, or a checkpoint id."""
    if not checkpoints:
        raise errors.NotFound("the job has no checkpoints (yet)", status_code=404, code="no_checkpoints")
    if which == "latest":
        return max(checkpoints, key=lambda c: c.step)
    if which == "best":
        if report is None:
            raise errors.StareError("'best' needs the job's report")
        scores = {row.step: row.avg_at_k for row in report.evaluation.history if row.avg_at_k is not None}
        candidates = [c for c in checkpoints if c.step in scores]
        if not candidates:
            steps = ", ".join(str(c.step) for c in checkpoints)
            raise errors.NotFound(
                f"no checkpoint step ({steps}) has a held-out evaluation: set evaluation.interval to a "
                "multiple of checkpoint.interval",
                status_code=404,
                code="no_evaluated_checkpoint",
            )
        return max(candidates, key=lambda c: (scores[c.step], c.step))
    if isinstance(which, int):
        for c in checkpoints:
            if c.step == which:
                return c
        raise errors.NotFound(
            f"no checkpoint at step {which} (steps: {', '.join(str(c.step) for c in checkpoints)})",
            status_code=404,
            code="not_found",
            param="step",
        )
    for c in checkpoints:
        if c.id == which:
            return c
    if isinstance(which, str) and which.isdigit():
        return select(checkpoints, int(which), report)
    raise errors.NotFound(
        f"no checkpoint {which!r}: use latest, best, a step or a checkpoint id",
        status_code=404,
        code="not_found",
        param="checkpoint",
    )


# ------------------------------------------------------------------------------------------------ staging


def target_folder(to: str | os.PathLike[str] | None, job_id: str, step: int) -> Path:
    """`to` as given, else ./<job id>-step-NNNNNN. The job id and step come from the server's listing: the
    default is built only from an id that matches the id pattern and a non-negative step, and it must
    resolve to an entry of the working folder, else a StareError (nothing is created)."""
    if to is not None:
        return Path(to)
    if not isinstance(job_id, str) or JOB_ID.fullmatch(job_id) is None:
        raise errors.StareError(
            f"the checkpoint listing names job id {job_id[:80]!r}, which is not a job id "
            f"(job_ + 26 base-32 characters); refused to build a folder name from it (pass to= / --to)",
            code="bad_job_id",
            param="job_id",
        )
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 10**12:
        raise errors.StareError(f"the checkpoint listing names step {step!r}", code="bad_step", param="step")
    here = Path.cwd().resolve()
    target = here / f"{job_id}-step-{step:06d}"
    inside(target, here)
    return target


def inside(path: Path, folder: Path) -> Path:
    """`path` once it resolves (links followed) to `folder` or under it; else a StareError, before any
    write."""
    resolved, base = path.resolve(), folder.resolve()
    if resolved != base and base not in resolved.parents:
        raise errors.StareError(
            f"{path} resolves to {resolved}, outside {base}; refused", code="outside_folder", param="to"
        )
    return path


def staging_folder(target: Path) -> Path:
    """A fresh hidden sibling of `target` (same filesystem, so the final rename is atomic); leftovers of an
    earlier interrupted download of the same target are removed first."""
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f".{target.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = parent / f".{target.name}.partial-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    return staging


def check_target(target: Path, overwrite: bool) -> None:
    if target.exists() and not overwrite:
        raise errors.StareError(
            f"{target} already exists (pass overwrite=True / --overwrite to replace it)",
            code="target_exists",
            param="to",
        )


def verify(
    actual_sha256: str, actual_bytes: int, expected_sha256: str | None, expected_bytes: int | None
) -> None:
    if expected_bytes is not None and actual_bytes != expected_bytes:
        raise errors.ChecksumMismatch(
            f"the download stopped at {actual_bytes} of {expected_bytes} bytes", code="incomplete_download"
        )
    if expected_sha256 is None:
        raise errors.ChecksumMismatch("the server sent no X-Content-SHA256", code="no_checksum")
    if actual_sha256 != expected_sha256.lower():
        raise errors.ChecksumMismatch(
            f"SHA-256 of the download is {actual_sha256}, the server announced {expected_sha256}",
            code="checksum_mismatch",
        )


def publish(tree: Path, target: Path, overwrite: bool) -> None:
    """Rename the finished folder to its target (the only step that makes it visible under that name)."""
    if target.exists():
        if not overwrite:
            check_target(target, overwrite)
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
        os.rename(tree, target)
        shutil.rmtree(old, ignore_errors=True)
        return
    os.rename(tree, target)


# ------------------------------------------------------------------------------------------------- loading


def loadable(root: Path, merged: bool, base_model: object = None) -> tuple[Path, str]:
    """(folder for from_pretrained, kind) of an unpacked checkpoint; merges locally when asked for and
    needed (see the module docstring)."""
    model, adapter = root / MODEL_DIR, root / ADAPTER_DIR
    if merged:
        if (model / "config.json").is_file():
            return model, "model"
        if adapter.is_dir():
            return merge_adapter(adapter, root / MERGED_DIR, base_model), "merged"
        raise errors.MergeUnavailable(f"{root} holds neither model/ nor adapter/", code="merge_unavailable")
    if adapter.is_dir():
        return adapter, "adapter"
    if model.is_dir():
        return model, "model"
    raise errors.StareError(f"{root} holds neither model/ nor adapter/", code="bad_checkpoint")


def merge_adapter(adapter: Path, out: Path, base_model: object = None) -> Path:
    """Merge a LoRA adapter into its base model and save the full model, with the adapter folder's tokenizer
    files, to `out`. Needs peft (which brings transformers). `base_model`: a loaded model, a folder or hub id,
    or None for the adapter's own `base_model_name_or_path`."""
    try:
        import peft
    except ImportError as err:
        raise errors.MergeUnavailable(
            f"merging a LoRA adapter here needs peft and transformers ({err.name} is not installed); or "
            "submit the job with model.lora.merge_on_save: true",
            code="merge_unavailable",
        ) from err
    if base_model is not None and not isinstance(base_model, str | os.PathLike):
        model = peft.PeftModel.from_pretrained(cast(Any, base_model), str(adapter))  # the caller's model
    else:
        base = os.fspath(base_model) if base_model is not None else _adapter_base(adapter)
        if not base:
            raise errors.MergeUnavailable(
                "this LoRA checkpoint has no merged weights and its adapter names no loadable base model (a "
                "built-in model the trainer builds in code): pass base_model= the base (loaded, or saved with "
                "save_pretrained), or submit the job with model.lora.merge_on_save: true",
                code="merge_unavailable",
                param="base_model",
            )
        source = out.parent / f".{out.name}.adapter"  # a copy of the adapter that names this base
        shutil.copytree(adapter, source)
        config_path = source / "adapter_config.json"
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = base
        config_path.write_text(json.dumps(config))
        try:
            model = peft.AutoPeftModelForCausalLM.from_pretrained(str(source))
        finally:
            shutil.rmtree(source, ignore_errors=True)
    merged = model.merge_and_unload()
    merged.save_pretrained(str(out), safe_serialization=True)
    for item in adapter.iterdir():  # the tokenizer the trainer saved beside the adapter
        if item.is_file() and not item.name.startswith(("adapter_", "README")):
            shutil.copy2(item, out / item.name)
    return out


def _adapter_base(adapter: Path) -> str | None:
    try:
        config = json.loads((adapter / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    return str(base) if base else None
