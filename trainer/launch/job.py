"""One job run in this process: the entry that `python -m trainer run` and the Ray worker both call
(`run_job`), and the `run` command's arguments, declared once for both command lines (`add_run_arguments`:
trainer/launch/cli.py and trainer/launch/ray_driver.py, whose driver takes the same arguments plus the cluster's).

A job that cannot run as given (an unreadable or invalid spec, bad task data or parameters found while
loading, a launch whose process count is not the spec's) raises `Refused`, which the callers turn into
exit code 2 with the message on stderr.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from contract.protocol import EVENT_PREFIX
from contract.spec import TrainSpec, load_spec

if TYPE_CHECKING:
    from trainer.events import EventCallback, StopPolicy


class Refused(Exception):
    """The job cannot run as given (exit 2); the message says why."""


def _format_validation(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(spec)"
        lines.append(f"  {loc}: {e['msg']}")
    return "invalid job spec:\n" + "\n".join(lines)


def load_job_spec(path: str | Path) -> TrainSpec:
    """The job spec at `path`, or Refused naming what is wrong with it."""
    try:
        return load_spec(path)
    except ValidationError as err:
        raise Refused(_format_validation(err)) from None
    except (OSError, ValueError) as err:
        raise Refused(f"cannot read job spec: {err}") from None


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The `run` command's arguments: SPEC --out DIR [--resume] [--no-progress] [--events-stdout]."""
    parser.add_argument("spec")
    parser.add_argument("--out", required=True, help="output directory (events, checkpoints, report)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--events-stdout",
        action="store_true",
        help=f"also print each event to stdout as one line '{EVENT_PREFIX}<json>' (for a supervising worker)",
    )


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
    from trainer.engine import Engine  # heavy imports only when training

    try:
        engine = Engine(spec, out, resume=resume, callbacks=callbacks, progress=progress, stop=stop)
        return int(engine.run())
    except ValueError as err:  # bad task data or parameters discovered at load time
        raise Refused(f"error: {err}") from None
