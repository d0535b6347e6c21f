"""GET /healthz latency while clients send the worst JSON bodies, authenticated and not (issue 44, R3).

What runs, on loopback: a throwaway PostgreSQL database (created, migrated, dropped at the end); the API
(`python -m service serve`, one uvicorn process, production rate limits) from a source tree, this one by
default or `--source DIR` (say an export of an older commit: `git archive c078183 | tar -x -C DIR`, so the
figures before and after a change are taken on one machine, one after the other); `--clients` attackers in
their own process (bench/event_loop_load.py: half with a valid key each, of a tenant each, half with a wrong
one; each sends 1 MiB hostile bodies one after another to POST /v1/jobs/estimate); and in this process a
probe that times GET /healthz every 20 ms for `--seconds`. Reported: the probe's p50, p99 and max, and the
attackers' answers by status.

    .venv/bin/python bench/bench_event_loop.py [--source DIR] [--clients 8] [--authenticated N] [--seconds 20]
        [--dedicated] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import _common  # noqa: F401 - the repository root on sys.path

from bench.event_loop_load import run

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=ROOT, help="the source tree the API runs from")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--authenticated", type=int, default=None, help="of the clients (default: half)")
    parser.add_argument(
        "--dedicated",
        action="store_true",
        help="root only: the API at nice -10, the attackers at +10 (the machine's other work weighs on neither)",
    )
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--smoke", action="store_true", help="2 clients, 3 s")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    clients, seconds = (2, 3.0) if args.smoke else (args.clients, args.seconds)
    result = run(args.source.resolve(), clients, seconds, args.authenticated, dedicated=args.dedicated)
    result["machine"] = {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load": os.getloadavg(),
    }
    result["smoke"] = args.smoke
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
