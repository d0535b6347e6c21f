"""Command line: `python -m trainer run SPEC --out DIR [--resume]`, `validate SPEC`, `report DIR`.

Exit codes are contract.protocol.ExitCode (0 ok, 2 user error, 3 non-finite, 74 a write to the run folder
failed (contract.storage), 75 interrupted after a checkpoint, 1 other failure); --events-stdout prints
each event as contract.protocol.format_event_line does. Under torchrun (TORCHELASTIC_ERROR_FILE set) a
failing process also writes its exit report, so that torchrun's own exit 1 can be traced back to it
(contract.protocol.exit_report).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from contract.protocol import (
    ERROR_FILE_ENV,
    EVENT_PREFIX,
    EVENTS_FILE,
    ExitCode,
    exit_report,
    format_event_line,
)
from contract.spec import TrainSpec, load_spec


def _print_event(event: dict[str, Any]) -> None:
    sys.stdout.write(format_event_line(event) + "\n")
    sys.stdout.flush()


def _format_validation(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(spec)"
        lines.append(f"  {loc}: {e['msg']}")
    return "invalid job spec:\n" + "\n".join(lines)


class Refused(Exception):
    """The job cannot run as given (exit 2); the message says why."""


def _load(path: str) -> TrainSpec:
    try:
        return load_spec(path)
    except ValidationError as err:
        raise Refused(_format_validation(err)) from None
    except (OSError, ValueError) as err:
        raise Refused(f"cannot read job spec: {err}") from None


def _report_exit(message: str, callstack: str = "") -> None:
    """Under torchrun: this process's exit report, where torchrun looks for it (contract.protocol)."""
    path = os.environ.get(ERROR_FILE_ENV)
    if path:
        with contextlib.suppress(OSError), open(path, "w") as fh:  # never in the way of the exit code
            fh.write(exit_report(message, callstack))


def main(argv: list[str] | None = None) -> int:
    """The command line; returns the exit code. A process that fails reports why (`_report_exit`)."""
    try:
        code = _main(argv)
    except Refused as err:
        print(err, file=sys.stderr)
        _report_exit(str(err))
        return ExitCode.USER_ERROR
    except Exception as err:  # a crash: exit 1 with its traceback, on stderr and in the report
        _report_exit(f"{type(err).__name__}: {err}", traceback.format_exc())
        raise
    if code != ExitCode.OK:
        _report_exit(f"the trainer exited with code {code} ({ExitCode(code).name})")
    return code


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer", description="Entropy-stable RL fine-tuning engine"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a job spec")
    run.add_argument("spec")
    run.add_argument("--out", required=True, help="output directory (events, checkpoints, report)")
    run.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    run.add_argument("--no-progress", action="store_true")
    run.add_argument(
        "--events-stdout",
        action="store_true",
        help=f"also print each event to stdout as one line '{EVENT_PREFIX}<json>' (for a supervising worker)",
    )
    val = sub.add_parser("validate", help="validate a job spec and print it with defaults resolved")
    val.add_argument("spec")
    rep = sub.add_parser("report", help="(re)build report.json and report.html from OUT/events.jsonl")
    rep.add_argument("out")
    args = parser.parse_args(argv)

    if args.command == "validate":
        print(json.dumps(_load(args.spec).resolved(), indent=2))
        return ExitCode.OK
    if args.command == "report":
        from trainer.report import load_events, write_report

        paths = write_report(load_events(Path(args.out) / EVENTS_FILE), Path(args.out))
        print("\n".join(str(p) for p in paths))
        return ExitCode.OK
    spec = _load(args.spec)
    from trainer.engine import Engine  # heavy imports only when training

    callbacks = [_print_event] if args.events_stdout else []
    engine = Engine(
        spec, args.out, resume=args.resume, callbacks=callbacks, progress=False if args.no_progress else None
    )
    try:
        code = engine.run()
    except ValueError as err:  # bad task data or parameters discovered at load time
        raise Refused(f"error: {err}") from None
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
