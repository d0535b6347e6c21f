"""Documents generated from the contract (docs/metrics.md, docs/ALGORITHMS.md §8): one command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def generated_doc_main(argv: list[str] | None, *, prog: str, path: Path, render: Callable[[str], str]) -> int:
    """`prog [--write]`: print the document `render` makes from the current text of `path`, or write it."""
    parser = argparse.ArgumentParser(prog=prog, description=f"Print (or --write) {path.name}")
    parser.add_argument("--write", action="store_true", help=f"write {path} instead of printing it")
    args = parser.parse_args(argv)
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    text = render(current)
    if args.write:
        path.write_text(text, encoding="utf-8")
        print(path)
    else:
        sys.stdout.write(text)
    return 0
