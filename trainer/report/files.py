"""The report's files: reading OUT/events.jsonl (`load_events`) and writing report.json and report.html
next to it, each atomically (`write_report`)."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainer.report.page import render_html
from trainer.report.summary import build_report

logger = logging.getLogger(__name__)


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """The events of events.jsonl, in order.

    A torn last line (the writer died mid-line) is skipped silently. A malformed line elsewhere (a torn
    line that a resumed run appended after) is skipped with a warning rather than losing the whole report.
    """
    lines = Path(path).read_bytes().split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    events: list[dict[str, Any]] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            event = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            if number != len(lines):
                logger.warning("%s:%d: skipping a malformed event line", path, number)
            continue
        if isinstance(event, dict):
            events.append(event)
        else:
            logger.warning("%s:%d: skipping an event that is not a JSON object", path, number)
    return events


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the service may read it as another user
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(events: Iterable[Any], out_dir: str | Path) -> tuple[Path, Path]:
    """Write out_dir/report.json and out_dir/report.html, each atomically; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = build_report(events)
    json_path, html_path = out / "report.json", out / "report.html"
    _write_atomic(json_path, json.dumps(report, separators=(",", ":"), allow_nan=False) + "\n")
    _write_atomic(html_path, render_html(report))
    return json_path, html_path
