"""Code and data apart: no run data inside a Python package (run folders live in results/), and the
results pages in docs/ link the report's one stylesheet instead of carrying a copy of it. What results/
keeps in git is checked in tests/experiments/test_rundata.py."""

from __future__ import annotations

import re
from pathlib import Path

from trainer.report import CSS_FILE

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "trainer", "service", "worker", "experiments", "store", "monitoring", "stare_client")
RUN_FILES = ("events.jsonl", "events.jsonl.gz", "result.json")


def test_no_python_package_holds_run_data() -> None:
    found = [
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for name in RUN_FILES
        for path in (ROOT / package).rglob(name)
    ]
    assert found == []
    # the run folders of the SmolLM2 page are where its script reads them
    assert any((ROOT / "results" / "smollm2" / "runs").rglob("events.jsonl.gz"))
    assert "--root results/smollm2" in (ROOT / "experiments" / "run-smollm2.sh").read_text()


def test_the_results_pages_link_the_report_stylesheet_and_hold_no_copy() -> None:
    pages = sorted((ROOT / "docs").glob("results*.html"))
    assert pages
    first_rule = CSS_FILE.read_text().split("*/", 1)[1].strip().splitlines()[0]
    for page in pages:
        text = page.read_text()
        (href,) = re.findall(r'<link rel="stylesheet" href="([^"]+)">', text)
        assert (page.parent / href).resolve() == CSS_FILE.resolve(), page
        assert first_rule not in text, page
