"""Runs a plan's jobs as `python -m trainer run SPEC --out DIR` processes, several at a time.

- Each run lives in ROOT/runs/<run id>/ with the spec it was given (spec.yaml), the engine's events.jsonl,
  checkpoints and report, and, once it has ended, result.json (exit code, wall time, threads, CPU). A run
  that finished is compacted: its events gzipped (events.jsonl.gz), its checkpoints removed unless the run
  keeps them (experiments/rundata.py, which every reader of run folders goes through).
- A run whose events end with `finished` is skipped. A run with a checkpoint but no `finished` (an
  interrupted or crashed run) is continued with --resume; anything else starts afresh.
- Runs whose spec depends on another run's output (a shared SFT warm-start) wait for it.
- `jobs` is a thread budget: runs start while the sum of their torch thread counts fits in it (each run
  gets its own OMP_NUM_THREADS / MKL_NUM_THREADS, which torch's intra-op threads follow), so on two cores
  two one-thread runs share the machine and a two-thread run has it alone.
- SIGINT/SIGTERM: the children are sent SIGTERM (the engine checkpoints and exits 75) and the runner
  stops; running the same command again resumes them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from contract.protocol import CHECKPOINT_GLOB, CHECKPOINTS_DIR, EventType, ExitCode
from experiments import rundata
from experiments.plan import Run
from experiments.system import cpu_info

REPO = Path(__file__).resolve().parent.parent
RESULT_FILE = "result.json"


def run_dir(root: Path, run: Run) -> Path:
    return root / "runs" / run.id


def events_of(path: Path) -> list[dict[str, Any]]:
    """The events of a run folder, plain or compressed (experiments/rundata.py; lines that do not parse are
    skipped: a crash can cut the last one)."""
    return rundata.read_events(path)


def is_finished(path: Path) -> bool:
    return any(e.get("type") == EventType.FINISHED for e in events_of(path))


def has_checkpoint(path: Path) -> bool:
    return any((path / CHECKPOINTS_DIR).glob(f"{CHECKPOINT_GLOB}/state.json"))


@dataclass
class _Active:
    run: Run
    proc: subprocess.Popen[bytes]
    started: float
    resumed: bool


class Runner:
    def __init__(
        self,
        root: Path,
        runs: Sequence[Run],
        *,
        jobs: int = 2,
        log: Callable[[str], None] = print,
        python: str = sys.executable,
    ) -> None:
        if jobs < 1:
            raise ValueError("jobs must be ≥ 1")
        self.root = root
        self.runs = list(runs)
        self.jobs = jobs
        self.log = log
        self.python = python
        self._stop = False
        ids = [r.id for r in self.runs]
        if len(set(ids)) != len(ids):
            raise ValueError("run ids must be unique")
        known = set(ids)
        for r in self.runs:
            missing = [d for d in r.needs if d not in known]
            if missing:
                raise ValueError(f"run {r.id} needs {missing}, which are not in the plan")

    # ------------------------------------------------------------------ one run

    def _spec_for(self, run: Run) -> dict[str, Any]:
        return run.resolve_spec(lambda other: run_dir(self.root, self._by_id(other)))

    def _by_id(self, run_id: str) -> Run:
        return next(r for r in self.runs if r.id == run_id)

    def _start(self, run: Run) -> _Active:
        path = run_dir(self.root, run)
        path.mkdir(parents=True, exist_ok=True)
        resumed = has_checkpoint(path)
        spec_file = path / "spec.yaml"
        spec = self._spec_for(run)
        if resumed and spec_file.exists() and yaml.safe_load(spec_file.read_text()) != spec:
            # The plan changed under an unfinished run: its checkpoints belong to another spec.
            resumed = False
        if not resumed:
            rundata.remove_events(path)
            for child in (CHECKPOINTS_DIR, "reference", RESULT_FILE):
                target = path / child
                if target.is_dir():
                    _rmtree(target)
                elif target.exists():
                    target.unlink()
        spec_file.write_text(yaml.safe_dump(spec, sort_keys=True))
        threads = str(run.threads)
        env = {
            **os.environ,
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        cmd = [self.python, "-m", "trainer", "run", str(spec_file), "--out", str(path), "--no-progress"]
        if resumed:
            cmd.append("--resume")
        log_file = open(path / "trainer.log", "ab")  # noqa: SIM115 (closed when the process ends)
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        log_file.close()
        self.log(f"start  {run.id} (threads {run.threads}{', resumed' if resumed else ''})")
        return _Active(run, proc, time.monotonic(), resumed)

    def _finish(self, active: _Active, code: int) -> None:
        path = run_dir(self.root, active.run)
        wall = time.monotonic() - active.started
        previous = read_json(path / RESULT_FILE) or {}
        result = {
            "run": active.run.id,
            "exit_code": code,
            # A resumed run adds its time to what the interrupted attempts took.
            "wall_seconds": wall + (float(previous.get("wall_seconds", 0.0)) if active.resumed else 0.0),
            "threads": active.run.threads,
            "attempts": int(previous.get("attempts", 0)) + 1 if active.resumed else 1,
            "cpu": cpu_info(),
        }
        _write_atomic(path / RESULT_FILE, json.dumps(result, indent=2, sort_keys=True))
        if code == ExitCode.OK and is_finished(path):
            rundata.compress_events(path)
            if not active.run.keep_checkpoints:
                for child in (CHECKPOINTS_DIR, "reference"):
                    if (path / child).is_dir():
                        _rmtree(path / child)
        verdicts: dict[int, str] = {ExitCode.OK: "done", ExitCode.INTERRUPTED: "stopped"}
        verdict = verdicts.get(code, f"failed (exit {code})")
        self.log(f"{verdict:<6} {active.run.id} in {wall:.0f} s")

    # ------------------------------------------------------------------ the loop

    def _handle_signal(self, signum: int, _frame: Any) -> None:
        self._stop = True

    def run(self) -> dict[str, int]:
        """Runs what is not finished. Returns counts: done, skipped, failed, stopped, blocked."""
        counts = {"done": 0, "skipped": 0, "failed": 0, "stopped": 0, "blocked": 0}
        pending = [r for r in self.runs if not is_finished(run_dir(self.root, r))]
        counts["skipped"] = len(self.runs) - len(pending)
        if counts["skipped"]:
            self.log(f"skip   {counts['skipped']} finished run(s)")
        failed: set[str] = set()
        active: list[_Active] = []
        previous = {sig: signal.signal(sig, self._handle_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while pending or active:
                if self._stop:
                    self._stop_all(active, counts)
                    break
                self._reap(active, counts, failed)
                for r in [r for r in pending if any(d in failed for d in r.needs)]:
                    pending.remove(r)
                    failed.add(r.id)
                    counts["blocked"] += 1
                    self.log(f"block  {r.id}: a run it needs failed")
                self._fill(pending, active)
                if pending and not active:
                    raise RuntimeError("runs wait on each other: " + ", ".join(r.id for r in pending))
                time.sleep(0.2)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return counts

    def _stop_all(self, active: list[_Active], counts: dict[str, int]) -> None:
        for a in active:
            if a.proc.poll() is None:
                a.proc.send_signal(signal.SIGTERM)
        for a in active:
            code = a.proc.wait()
            self._finish(a, code)
            counts["stopped" if code == ExitCode.INTERRUPTED else "failed"] += 1
        active.clear()

    def _reap(self, active: list[_Active], counts: dict[str, int], failed: set[str]) -> None:
        for a in list(active):
            code = a.proc.poll()
            if code is None:
                continue
            active.remove(a)
            self._finish(a, code)
            if code == ExitCode.OK:
                counts["done"] += 1
            else:
                counts["failed"] += 1
                failed.add(a.run.id)

    def _fill(self, pending: list[Run], active: list[_Active]) -> None:
        """Starts ready runs while their threads fit in the budget (`jobs`); one at least when idle."""
        while True:
            free = self.jobs - sum(a.run.threads for a in active)
            ready = next((r for r in pending if self._ready(r) and (r.threads <= free or not active)), None)
            if ready is None:
                return
            pending.remove(ready)
            active.append(self._start(ready))

    def _ready(self, run: Run) -> bool:
        return all(is_finished(run_dir(self.root, self._by_id(d))) for d in run.needs)


read_json = rundata.read_json


def _write_atomic(path: Path, text: str) -> None:
    """Writes `text` to `path` through a temporary file and a rename: a reader sees the old or the new file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
