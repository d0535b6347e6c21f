"""The `run` command as both command lines take it (`python -m trainer run`: trainer/launch/cli.py, and the
Ray driver: trainer/launch/ray_driver.py, which adds the cluster's arguments): its arguments, declared once
(`add_run_arguments`), and the job spec it names (`load_job_spec`). Light on purpose: the Ray driver reads
it and never loads the engine (torch and transformers load only in the training processes).

A job that cannot run as given (an unreadable or invalid spec, bad task data or parameters found while
loading, a launch whose process count is not the spec's) raises `Refused`, which the callers turn into
exit code 2 with the message on stderr.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError

from contract.protocol import EVENT_PREFIX
from contract.spec import TrainSpec, load_spec
from contract.spec_problems import spec_problems


class Refused(Exception):
    """The job cannot run as given (exit 2); the message says why."""


def _format_validation(err: ValidationError) -> str:
    """Every problem of the spec on its own line, at its field path, in the API's plain words (with the
    name meant for an unknown field or value: contract.spec_problems)."""
    problems = spec_problems(err, TrainSpec)
    lines = [f"  {p.field or '(spec)'}: {p.message}" for p in problems]
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
