"""Run data out of the default clone's way (issue 45): one loader reads run folders plain or compressed,
the writer compresses a finished run reproducibly, and results/ holds in git only what a page reads (per
run its compressed events and summary; per control cell a measured noise floor), at most 8 MB on disk."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest

from experiments import control_suite
from experiments.__main__ import committed_pages
from experiments.plan import OPTIONAL_SUITES
from experiments.rundata import (
    COMPRESSED_EVENTS,
    compact_tree,
    compress_events,
    events_path,
    read_events,
    remove_events,
)
from experiments.runner import events_of, run_dir

ROOT = Path(__file__).resolve().parents[2]
KEPT = {".gitignore", COMPRESSED_EVENTS, "result.json", "noise_floor.json"}
# What results/ may take in git. 8 MiB until the entropy law's second held-out round (issue 48) added six
# 500-step tiny-cell runs (~165 KB each, their per-step metrics); past 10 MiB, compaction should drop the
# per-step metrics no page reads rather than this budget grow again.
LIMIT_BYTES = 10 * 1024 * 1024
EVENTS = [
    {"type": "started", "spec": {"seed": 3}},
    {"type": "step", "step": 1, "metrics": {"entropy/mean": 0.5}},
    {"type": "finished"},
]


def _write(folder: Path, events: list[dict[str, object]], tail: str = "") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + tail)


def test_compressed_events_read_as_the_plain_ones_and_compress_reproducibly(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a, EVENTS, tail='{"type": "st')  # a crash cut the last line: skipped
    _write(b, EVENTS, tail='{"type": "st')
    plain = read_events(a)
    assert plain == EVENTS == events_of(a)
    assert compress_events(a) == a / COMPRESSED_EVENTS and not (a / "events.jsonl").exists()
    assert read_events(a) == plain and events_path(a) == a / COMPRESSED_EVENTS
    compress_events(b)
    assert (a / COMPRESSED_EVENTS).read_bytes() == (b / COMPRESSED_EVENTS).read_bytes()  # no name, no time
    assert compress_events(a) is None  # nothing plain left
    remove_events(a)
    assert events_path(a) is None and read_events(a) == []


def test_a_plain_file_being_written_wins_over_an_older_compressed_one(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    _write(folder, EVENTS)
    compress_events(folder)
    _write(folder, EVENTS[:2])  # the run started again and is writing
    assert read_events(folder) == EVENTS[:2]


def test_compact_tree_compresses_finished_runs_only(tmp_path: Path) -> None:
    _write(tmp_path / "runs" / "done" / "seed0", EVENTS)
    _write(tmp_path / "runs" / "running" / "seed0", EVENTS[:2])
    assert compact_tree(tmp_path) == [tmp_path / "runs" / "done" / "seed0"]
    assert (tmp_path / "runs" / "running" / "seed0" / "events.jsonl").is_file()
    with gzip.open(tmp_path / "runs" / "done" / "seed0" / COMPRESSED_EVENTS, "rt") as fh:
        assert [json.loads(line) for line in fh] == EVENTS


def _tracked() -> list[Path]:
    done = subprocess.run(
        ["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"not a git checkout: {done.stderr.strip()}")
    return [Path(line) for line in done.stdout.splitlines()]


def test_results_in_git_hold_only_what_a_page_reads_within_8_mb() -> None:
    tracked = _tracked()
    assert tracked
    assert {path.name for path in tracked} <= KEPT, sorted({p.name for p in tracked} - KEPT)
    # `du` of what `git ls-files results` lists: the blocks each file takes on disk
    on_disk = sum((ROOT / path).stat().st_blocks * 512 for path in tracked)
    assert on_disk <= LIMIT_BYTES, on_disk
    # every run folder is a run of a suite whose page is built from results/ (experiments pages)
    read: set[Path] = set()
    for command in committed_pages():
        root = Path(command[command.index("--root") + 1])
        suites = [command[i + 1] for i, arg in enumerate(command) if arg == "--suite"]
        for name in suites:
            read |= {run_dir(root, run) for run in OPTIONAL_SUITES[name]().runs}
            if name in control_suite.CELLS:
                read.add(root / "runs" / name)  # its noise_floor.json
    # the second-generation law's page reads every run of its cells (experiments/control2_page.py)
    for name in (n for n in OPTIONAL_SUITES if n.startswith("ctl2-")):
        read |= {run_dir(Path("results/control2"), run) for run in OPTIONAL_SUITES[name]().runs}
    stray = [str(p) for p in tracked if p.name != ".gitignore" and p.parent not in read]
    assert stray == []
