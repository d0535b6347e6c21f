"""`python -m experiments run [--quick] [--jobs N] [--root DIR] [--suite NAME ...] [--arm A ...]
[--seed N ...] [--md F --html F --header F --footer F]`, then `page`.

`run` runs every run of the plan that has not finished (finished runs are skipped, interrupted ones resumed),
then writes the page; `page` only rebuilds the page from what is on disk; `list` prints the plan.
`python -m experiments compact DIR` compresses the events of the finished runs under DIR that are still kept
plain (experiments/rundata.py: what results/ keeps in git). `python -m experiments pages` (`make pages`)
rebuilds the pages whose run data is in git, from results/ alone: docs/RESULTS-smollm2.md and
docs/RESULTS-control.md, their figures in build/results-smollm2.html and build/results-control.html.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from contract.protocol import ExitCode
from experiments import control2_page, control_suite
from experiments.page import write_page
from experiments.plan import OPTIONAL_SUITES, all_runs, build_plan
from experiments.rundata import compact_tree
from experiments.runner import Runner, is_finished, run_dir
from experiments.system import cpu_label

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = REPO / "runs" / "experiments"
HEADER = REPO / "experiments" / "RESULTS_HEADER.md"
FOOTER = REPO / "experiments" / "RESULTS_FOOTER.md"


# The second-generation law's run folders in results/ (its page: experiments/control2_page.py).
CONTROL2_RUNS = Path("results/control2/runs")


def committed_pages() -> list[list[str]]:
    """The `page` commands of the pages built from results/ (paths relative to the repository: they are
    written into the pages as they are given)."""
    smollm2 = ["--suite", "smollm2-add-lr2e-5", "--suite", "smollm2-add-lr3e-6", "--root", "results/smollm2"]
    cells = [arg for cell in control_suite.CELLS for arg in ("--suite", cell)]
    control = [*cells, "--root", "results/control", "--baseline-root", "results/smollm2"]
    return [
        ["page", *smollm2, *_page_files("smollm2", "SMOLLM2")],
        ["page", *control, *_page_files("control", "CONTROL")],
    ]


def _page_files(name: str, prefix: str) -> list[str]:
    return [
        *("--md", f"docs/RESULTS-{name}.md", "--html", f"build/results-{name}.html"),
        *("--header", f"experiments/RESULTS_{prefix}_HEADER.md"),
        *("--footer", f"experiments/RESULTS_{prefix}_FOOTER.md"),
    ]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "pages":
        os.chdir(REPO)
        code = max(main(command) for command in committed_pages())
        if CONTROL2_RUNS.is_dir():  # the second-generation law's page (experiments/control2_page.py)
            code = max(code, control2_page.main([str(CONTROL2_RUNS), "--md", "docs/RESULTS-control2.md"]))
        return code
    if args.command == "compact":
        folders = compact_tree(args.folder)
        print(f"compacted {len(folders)} finished run(s) under {args.folder}")
        return 0
    plan = build_plan(quick=args.quick, suites=tuple(args.suite) if args.suite else None)
    root = args.root or Path(str(DEFAULT_ROOT) + ("-quick" if args.quick else ""))
    runs = [
        r
        for r in all_runs(plan)
        if (not args.arm or r.arm in args.arm) and (args.seed is None or r.seed in args.seed)
    ]
    if args.command == "list":
        for r in runs:
            state = "finished" if is_finished(run_dir(root, r)) else "to run"
            print(f"{r.id:<40} threads {r.threads}  {state}")
        return 0
    if args.command == "run":
        print(f"{len(runs)} runs in {root}, {args.jobs} at a time, on {cpu_label()}", flush=True)
        t0 = time.monotonic()
        counts = Runner(root, runs, jobs=args.jobs, log=lambda m: print(m, flush=True)).run()
        print(f"{counts} in {time.monotonic() - t0:.0f} s", flush=True)
        if counts["stopped"]:
            print("stopped: run the same command again to resume", flush=True)
            return ExitCode.INTERRUPTED
    md = args.md or (REPO / "docs" / ("RESULTS-quick.md" if args.quick else "RESULTS.md"))
    page = args.html or (REPO / "docs" / ("results-quick.html" if args.quick else "results.html"))
    # Optional suites (the SmolLM2 background run) join the page once they have run folders.
    shown = plan + [
        suite
        for name, make in OPTIONAL_SUITES.items()
        if name not in {s.name for s in plan}
        for suite in [make()]
        if any(run_dir(root, r).exists() for r in suite.runs)
    ]
    write_page(
        root,
        shown,
        md,
        page,
        header=args.header.read_text().strip(),
        footer=args.footer.read_text().strip(),
        baseline_root=args.baseline_root,
    )
    print(f"wrote {md} and {page}")
    failed = sum(1 for r in runs if not is_finished(run_dir(root, r)))
    return 1 if args.command == "run" and failed else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "page", "list"):
        p = sub.add_parser(name)
        p.add_argument("--quick", action="store_true", help="the ≤ 10 min plan (2 seeds, headline pair)")
        p.add_argument(
            "--root", type=Path, default=None, help=f"run folders (default {DEFAULT_ROOT}[-quick])"
        )
        p.add_argument("--suite", action="append", help="only these suites (repeatable)")
        p.add_argument("--arm", action="append", help="only these arms' runs (repeatable)")
        p.add_argument("--seed", action="append", type=int, help="only these seeds' runs (repeatable)")
        p.add_argument("--md", type=Path, default=None, help="markdown page (default docs/RESULTS.md)")
        p.add_argument("--html", type=Path, default=None, help="HTML page (default docs/results.html)")
        p.add_argument("--header", type=Path, default=HEADER, help=f"page header (default {HEADER.name})")
        p.add_argument("--footer", type=Path, default=FOOTER, help=f"page footer (default {FOOTER.name})")
        p.add_argument(
            "--baseline-root",
            type=Path,
            default=None,
            help="the SmolLM2 suite's run folders, whose grpo_ds runs the a+b control cells reuse "
            "(default: ROOT/../smollm2)",
        )
        if name == "run":
            p.add_argument(
                "--jobs", type=int, default=os.cpu_count() or 1, help="runs at once (default: cores)"
            )
    compact = sub.add_parser("compact", help="gzip the events of the finished runs under a folder")
    compact.add_argument("folder", type=Path)
    sub.add_parser("pages", help="rebuild the pages whose run data is in results/ (no run is started)")
    return parser


if __name__ == "__main__":
    sys.exit(main())
