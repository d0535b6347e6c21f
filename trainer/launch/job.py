"""One job run in this process: the entry that `python -m trainer run` and the Ray worker both call
(`run_job`). The `run` command's arguments and its spec are trainer/launch/command.py's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trainer.engine import Engine
from trainer.launch.command import Refused, load_job_spec
from trainer.run.events import EventCallback, StopPolicy


def run_job(
    spec_path: str | Path,
    out: str | Path,
    *,
    resume: bool,
    callbacks: Sequence[EventCallback] = (),
    progress: bool | None = None,
    stop: StopPolicy | None = None,
) -> int:
    """Runs the job at `spec_path` into `out` in this process (one process of the launch); returns the
    engine's exit code. `stop`: the stop policy (default: the engine's, agreed above one process)."""
    spec = load_job_spec(spec_path)
    try:
        engine = Engine(spec, out, resume=resume, callbacks=callbacks, progress=progress, stop=stop)
        return int(engine.run())
    except ValueError as err:  # bad task data or parameters discovered at load time
        raise Refused(f"error: {err}") from None
