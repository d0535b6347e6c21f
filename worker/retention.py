"""What a job's checkpoints keep on the server (issue 46; contract/checkpointing.py states the policy).

A checkpoint's training state (`sharded/`: the weights again, AdamW's moments, the scheduler; `rng/`) is
about three times its `model/` and only a resume reads it, and a resume starts from the latest recorded
checkpoint (worker/training.py: a newer folder is discarded, an older one is never used). So once the row of
the checkpoint at step N is committed, the training state of every earlier checkpoint of the job goes,
unless the spec's `checkpoint.training_state` is "all". Not before the row: until then a lost worker's next
attempt resumes from the checkpoint before N, which must still be whole. The trainer never trims: it cannot
know which of its checkpoints are recorded.

When the job ends: succeeded, the last checkpoint's training state goes too (unless "latest" or "all"):
nothing resumes a succeeded job, and what users download is `model/`. Cancelled, failed or paused, the
latest checkpoint stays whole, so `POST /v1/jobs/{id}/resume` (a paused job, or one failed on a system
fault) continues from it; a cancelled or failed job's storage is freed by deleting the job.

A trimmed checkpoint's row gets its new size and loses its archive digest, which the next download computes
again (service/routers/checkpoints.py). Best effort: a folder that cannot be trimmed (a read-only disk) is
logged and left whole; the next checkpoint tries again.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.checkpointing import TRAINING_STATE, keeps_state_after_success
from contract.protocol import CHECKPOINTS_DIR, checkpoint_step
from store import repository
from store.artifacts import ArtifactStorage
from store.repository import Claim

logger = logging.getLogger(__name__)


def drop_training_state(folder: Path) -> bool:
    """Removes a checkpoint folder's training state; True when there was some."""
    found = False
    for name in TRAINING_STATE:
        part = folder / name
        if part.is_dir() and not part.is_symlink():
            shutil.rmtree(part)
            found = True
        elif part.exists() or part.is_symlink():
            part.unlink()
            found = True
    return found


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def trim_checkpoints(run_dir: Path, before_step: int | None) -> dict[int, int]:
    """Drops the training state of the run's checkpoints before `before_step` (None: of all of them);
    returns {step: bytes left} of each checkpoint it trimmed."""
    root = run_dir / CHECKPOINTS_DIR
    trimmed: dict[int, int] = {}
    if not root.is_dir():
        return trimmed
    for child in sorted(root.iterdir()):
        step = checkpoint_step(child.name)
        if step is None or not child.is_dir() or (before_step is not None and step >= before_step):
            continue
        try:
            if drop_training_state(child):
                trimmed[step] = folder_bytes(child)
        except OSError as err:
            logger.warning("cannot drop the training state of %s: %s", child, err)
    return trimmed


class Retention:
    """The policy for one claimed job. `write(fn)` runs fn(session) in a retried transaction (the
    Recorder's): the rows of trimmed checkpoints get their new sizes."""

    def __init__(self, claim: Claim, storage: ArtifactStorage, write: Callable[[Any], Any]) -> None:
        self.run_dir, self.job_id, self.write = storage.local_path(claim.run_dir), claim.job_id, write
        self.kept = str((claim.resolved_spec.get("checkpoint") or {}).get("training_state", "resume"))

    def recorded(self, events: list[dict[str, Any]]) -> None:
        """After the rows of `events` were committed: a recorded checkpoint makes the earlier ones' state
        unneeded."""
        steps = [int(e["step"]) for e in events if e.get("type") == "checkpoint"]
        if steps and self.kept != "all":
            self._trim(max(steps))

    def finished(self, status: str) -> None:
        """After the job's final status was committed."""
        if status == "succeeded" and not keeps_state_after_success(self.kept):
            self._trim(None)

    def _trim(self, before_step: int | None) -> None:
        trimmed = trim_checkpoints(self.run_dir, before_step)
        if trimmed:
            job_id = self.job_id
            try:
                self.write(lambda s: repository.checkpoints_trimmed(s, job_id, trimmed))
            except Exception:  # sizes only: the rows are right again at the next trim or never read
                logger.warning("job %s: cannot record the trimmed checkpoints' sizes", job_id, exc_info=True)
