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

from contract.protocol import ERROR_FILE_ENV, EVENTS_FILE, ExitCode, exit_report, format_event_line
from trainer.launch.command import Refused, add_run_arguments, load_job_spec
from trainer.launch.job import run_job
from trainer.report import load_events, write_report


def _print_event(event: dict[str, Any]) -> None:
    sys.stdout.write(format_event_line(event) + "\n")
    sys.stdout.flush()


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
    add_run_arguments(sub.add_parser("run", help="run a job spec"))
    val = sub.add_parser("validate", help="validate a job spec and print it with defaults resolved")
    val.add_argument("spec")
    rep = sub.add_parser("report", help="(re)build report.json and report.html from OUT/events.jsonl")
    rep.add_argument("out")
    args = parser.parse_args(argv)

    if args.command == "validate":
        print(json.dumps(load_job_spec(args.spec).resolved(), indent=2))
        return ExitCode.OK
    if args.command == "report":
        paths = write_report(load_events(Path(args.out) / EVENTS_FILE), Path(args.out))
        print("\n".join(str(p) for p in paths))
        return ExitCode.OK
    return run_job(
        args.spec,
        args.out,
        resume=args.resume,
        callbacks=[_print_event] if args.events_stdout else [],
        progress=False if args.no_progress else None,
    )


if __name__ == "__main__":
    sys.exit(main())
