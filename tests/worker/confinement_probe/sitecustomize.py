"""Test-only: what a hostile trainer would look for, run at its interpreter's start (tests/worker/
test_confinement.py puts this folder on the worker's PYTHONPATH; nothing else does).

In a trainer (`python -m trainer run SPEC --out DIR ...`), before the trainer's own code: reads its parent's
environment (/proc/<ppid>/environ), pid 1's, every readable /proc/<pid>/environ, and lists every folder from
/ down to its run folder; writes what it found to DIR/confinement-probe.json. Then the trainer runs as usual.
Any other process with this folder on its path (the worker) does nothing here.
"""

from __future__ import annotations

import json
import os
import sys


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except OSError as err:
        return f"error: {err.strerror}"


def _probe(out_dir: str) -> None:
    found: dict[str, object] = {"pid": os.getpid(), "ppid": os.getppid()}
    found["ppid_environ"] = _read(f"/proc/{os.getppid()}/environ")
    found["pid1_environ"] = _read("/proc/1/environ")
    environs = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            environs[entry] = _read(f"/proc/{entry}/environ")
    found["environs"] = environs
    listings = {}
    folder = os.path.abspath(out_dir)
    while True:
        try:
            listings[folder] = sorted(os.listdir(folder))
        except OSError as err:
            listings[folder] = [f"error: {err.strerror}"]
        if folder == "/":
            break
        folder = os.path.dirname(folder)
    found["listings"] = listings
    with open(os.path.join(out_dir, "confinement-probe.json"), "w") as handle:
        json.dump(found, handle)


if "--out" in sys.argv and "run" in sys.argv:
    _probe(sys.argv[sys.argv.index("--out") + 1])
