"""A claimed job's trainer, made ready and started: its run folder (the resolved spec written, checkpoints the
database never recorded discarded), its command (the trainer, torchrun above one process, or the Ray driver
of a job over several nodes), its confinement, and the supervised child (worker/supervisor.py)."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from contract.protocol import CHECKPOINT_GLOB, CHECKPOINTS_DIR, checkpoint_step
from contract.spec import TrainSpec
from contract.spec_problems import spec_problems
from contract.storage import storage_writes
from store.artifacts import ArtifactStorage
from store.repository import Claim
from worker.isolation import Confinement
from worker.settings import WorkerSettings
from worker.supervisor import TrainerProcess, ray_command, runs_torchrun, trainer_command

logger = logging.getLogger(__name__)


def start_trainer(
    claim: Claim, settings: WorkerSettings, storage: ArtifactStorage
) -> tuple[TrainerProcess, Path]:
    """The claimed job's trainer, started, and its log file. Raises contract.storage.StorageError (a write to
    the run folder failed), NoCluster, pydantic's ValidationError (a stored spec the contract now refuses)
    or OSError (the trainer could not be started)."""
    spec_path, out_dir, resume = prepare_run(claim, storage)
    command = job_command(claim, settings, spec_path, out_dir, resume=resume)
    log_path = out_dir / f"trainer-attempt-{claim.attempt}.log"
    # torchrun's error file: its first failed process's exit code and reason (worker/supervisor.py)
    error_file = out_dir / f"trainer-attempt-{claim.attempt}.error.json" if runs_torchrun(command) else None
    child = TrainerProcess(
        command,
        log_path=log_path,
        env={"PYTHONUNBUFFERED": "1"},
        error_file=error_file,
        confinement=job_confinement(claim, settings, storage, out_dir),
    )
    return child, log_path


def prepare_run(claim: Claim, storage: ArtifactStorage) -> tuple[Path, Path, bool]:
    """Writes the resolved spec next to the run's output; returns (spec path, out dir, resume?). A failed
    write raises contract.storage.StorageError."""
    out_dir = storage.local_path(claim.run_dir)
    with storage_writes(out_dir):
        return _prepare(claim, storage, out_dir)


def _prepare(claim: Claim, storage: ArtifactStorage, out_dir: Path) -> tuple[Path, Path, bool]:
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = dict(claim.resolved_spec)
    task = dict(spec.get("task") or {})
    if task.get("path"):
        task["path"] = str(storage.local_path(task["path"]))  # stored as a key
        spec["task"] = task
    spec_path = out_dir / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=True))
    discard_unrecorded_checkpoints(out_dir / CHECKPOINTS_DIR, claim.latest_checkpoint_step)
    resume = any((out_dir / CHECKPOINTS_DIR).glob(CHECKPOINT_GLOB))
    return spec_path, out_dir, resume


def discard_unrecorded_checkpoints(folder: Path, recorded_step: int | None) -> None:
    """Removes checkpoint folders newer than the latest checkpoint row (all of them when there is none).

    "Latest checkpoint" is the latest row. A newer folder was written by a trainer whose worker died before
    recording it (during a database outage, say), so steps before it may have no metric rows: resuming from
    it would leave a gap in the history. The trainer resumes from the newest folder left (or starts over).
    """
    if not folder.is_dir():
        return
    for child in folder.iterdir():
        step = checkpoint_step(child.name)
        if step is None or not child.is_dir():
            continue
        if recorded_step is None or step > recorded_step:
            logger.warning("discarding checkpoint %s: written after the latest recorded checkpoint", child)
            shutil.rmtree(child, ignore_errors=True)


def trainer_python(resolved_spec: dict[str, Any], settings: WorkerSettings) -> str:
    """The interpreter of the job's trainer: vllm_python for rollout.engine vllm when set, else python,
    else this one."""
    engine = (resolved_spec.get("rollout") or {}).get("engine", "hf")
    if engine == "vllm" and settings.vllm_python:
        return settings.vllm_python
    return settings.python or sys.executable


class NoCluster(Exception):
    """A multi-node job reached a worker that serves no Ray cluster."""


def job_command(
    claim: Claim, settings: WorkerSettings, spec_path: Path, out_dir: Path, *, resume: bool
) -> list[str]:
    """The child to supervise: the trainer on this host (torchrun above one process) for a one-node job,
    the Ray driver for a job over several nodes. Raises NoCluster for the latter without STARE_RAY_ADDRESS."""
    dist = TrainSpec.model_validate(claim.resolved_spec).distributed
    python = trainer_python(claim.resolved_spec, settings)
    if dist.nodes == 1:
        return trainer_command(
            python,
            spec_path,
            out_dir,
            resume=resume,
            num_processes=dist.world_size,
            stop_grace_s=settings.cancel_grace_s,
        )
    if not settings.ray_address:
        raise NoCluster(
            f"the job asks for distributed.nodes = {dist.nodes} and this worker serves no Ray cluster "
            "(STARE_RAY_ADDRESS is unset)"
        )
    return ray_command(python, spec_path, out_dir, resume=resume, settings=settings)


def job_confinement(
    claim: Claim, settings: WorkerSettings, storage: ArtifactStorage, out_dir: Path
) -> Confinement | None:
    """What the job's trainer may see (worker/isolation.py): its run folder and its uploaded task file; the
    host's network and PID namespace only for a Ray driver. None when the operator turned it off."""
    if not settings.trainer_isolation:
        return None
    task = claim.resolved_spec.get("task") or {}
    read_only = (storage.local_path(task["path"]),) if task.get("path") else ()
    ray = TrainSpec.model_validate(claim.resolved_spec).distributed.nodes > 1
    return Confinement(
        artifact_root=Path(settings.artifact_root),
        job_dir=out_dir,
        read_only=read_only,
        network=ray,
        own_pids=not ray,
        run_as=settings.trainer_uid if os.geteuid() == 0 else None,  # never root in the trainer
    )


def spec_refusal(err: ValidationError) -> str:
    """`invalid job spec: <field>: <why>` for each problem, in the words the API and the trainer use
    (contract.spec_problems)."""
    fields = "; ".join(f"{p.field or '(spec)'}: {p.message}" for p in spec_problems(err, TrainSpec))
    return f"invalid job spec: {fields}"[:1000]
