"""Command line: `python -m trainer run SPEC --out DIR [--resume]`, `validate SPEC`, `report DIR`.

Exit codes are contract.protocol.ExitCode (0 ok, 2 user error, 3 non-finite, 74 a write to the run folder
failed (contract.storage), 75 interrupted after a checkpoint, 1 other failure); --events-stdout prints
each event as contract.protocol.format_event_line does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from contract.protocol import EVENT_PREFIX, EVENTS_FILE, ExitCode, format_event_line
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


def _load(path: str) -> TrainSpec:
    try:
        return load_spec(path)
    except ValidationError as err:
        print(_format_validation(err), file=sys.stderr)
        raise SystemExit(ExitCode.USER_ERROR) from None
    except (OSError, ValueError) as err:
        print(f"cannot read job spec: {err}", file=sys.stderr)
        raise SystemExit(ExitCode.USER_ERROR) from None


def main(argv: list[str] | None = None) -> int:
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
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.USER_ERROR
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
