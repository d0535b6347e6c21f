"""Runs the trainer as a child process and turns its stdout event lines into Python dicts.

The child is `python -m trainer run SPEC --out DIR --events-stdout [--resume]` (or the same under
`accelerate launch` when the spec asks for several processes). It gets SIGKILL if the worker process dies
(PR_SET_PDEATHSIG), so a killed worker never leaves a trainer running behind a lost lease. Cooperative
stop: SIGTERM makes the trainer checkpoint and exit 75.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

EVENT_PREFIX = "@@event "  # trainer/__main__.py prints events with this prefix
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    os.setsid()  # own process group: signals reach accelerate's children too


def trainer_command(
    python: str, spec_path: Path, out_dir: Path, *, resume: bool, num_processes: int
) -> list[str]:
    args = ["run", str(spec_path), "--out", str(out_dir), "--no-progress", "--events-stdout"]
    if resume:
        args.append("--resume")
    if num_processes > 1:
        return [
            python,
            "-m",
            "accelerate.commands.launch",
            "--num_processes",
            str(num_processes),
            "--num_machines",
            "1",
            "--dynamo_backend",
            "no",
            "-m",
            "trainer",
            *args,
        ]
    return [python, "-m", "trainer", *args]


class TrainerProcess:
    """A supervised trainer: its events arrive on `events` (a queue of dicts; None marks end of output)."""

    def __init__(self, command: list[str], *, log_path: Path, env: dict[str, str] | None = None) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in wait()
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        self._reader = threading.Thread(target=self._read, name="trainer-stdout", daemon=True)
        self._reader.start()
        self.stop_requested = False

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            if line.startswith(EVENT_PREFIX):
                try:
                    self.events.put(json.loads(line[len(EVENT_PREFIX) :]))
                except json.JSONDecodeError:
                    continue
        self.events.put(None)

    def request_stop(self) -> None:
        """Cooperative stop: the trainer checkpoints and exits 75."""
        if not self.stop_requested and self.proc.poll() is None:
            self.stop_requested = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        self._log.close()
        return code


def log_tail(path: Path, limit: int = 2000) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace").strip()
