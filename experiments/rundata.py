"""A run folder's data, read and compacted in one place: every page builder and analysis reads runs through
here (experiments/runner.py's `events_of` and `read_json` are these functions).

A run folder (ROOT/runs/<run id>/) holds, while its trainer runs, the engine's events.jsonl, and once it
has ended result.json (exit code, wall time, threads, CPU: its summary). A finished run is compacted by
the runner (`compress_events`): its events are gzipped to events.jsonl.gz (a fixed header, so the same
events give the same bytes) and the plain file removed, about a tenth of the size; the checkpoints go too
(runner.py). That is what results/ keeps in git: per run, events.jsonl.gz and result.json; per cell, a noise_floor.json where
one was measured. The spec a run was given is in its events (the `started` event's resolved spec);
spec.yaml stays beside a run on disk for the runner (a resumed run is checked against it) but is not kept.

`read_events` takes the plain file when there is one (a run in progress, or one written before this
layout), else the compressed one; a line that does not parse (a crash can cut the last one) is skipped.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path
from typing import Any

from contract.protocol import EVENTS_FILE

COMPRESSED_EVENTS = EVENTS_FILE + ".gz"


def events_path(folder: Path) -> Path | None:
    """The run's events file: the plain one while it is being written, else the compressed one; None when
    the run has none."""
    for name in (EVENTS_FILE, COMPRESSED_EVENTS):
        if (folder / name).is_file():
            return folder / name
    return None


def read_events(folder: Path) -> list[dict[str, Any]]:
    path = events_path(folder)
    if path is None:
        return []
    if path.name == COMPRESSED_EVENTS:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            text = fh.read()
    else:
        text = path.read_text(encoding="utf-8")
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a file (result.json, noise_floor.json); None when absent or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def compress_events(folder: Path) -> Path | None:
    """events.jsonl → events.jsonl.gz (written aside, then renamed; the plain file removed). Reproducible:
    no file name or time in the gzip header. None when the folder has no plain events file."""
    plain = folder / EVENTS_FILE
    if not plain.is_file():
        return None
    target = folder / COMPRESSED_EVENTS
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=buffer, mtime=0) as gz:
        gz.write(plain.read_bytes())
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, target)
    plain.unlink()
    return target


def remove_events(folder: Path) -> None:
    """Both events files (a run that starts afresh)."""
    for name in (EVENTS_FILE, COMPRESSED_EVENTS):
        (folder / name).unlink(missing_ok=True)


def compact_tree(root: Path) -> list[Path]:
    """Compress the events of every finished run under `root` still kept plain (run folders written before
    this layout, or copied in); the folders compacted. A run whose events do not end in `finished` (one
    running now, or interrupted) is left as it is."""
    done = []
    for plain in sorted(root.rglob(EVENTS_FILE)):
        folder = plain.parent
        if any(e.get("type") == "finished" for e in read_events(folder)):
            compress_events(folder)
            done.append(folder)
    return done
