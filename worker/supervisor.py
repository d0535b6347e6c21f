"""Runs the trainer as a child process and turns its stdout event lines into Python dicts.

The child is `python -m trainer run SPEC --out DIR --events-stdout [--resume]` (or the same under
`accelerate launch` when the spec asks for several processes). It gets SIGKILL if the worker process dies
(PR_SET_PDEATHSIG), so a killed worker never leaves a trainer running behind a lost lease. Cooperative
stop: SIGTERM makes the trainer checkpoint and exit 75.

The trainer's stderr comes through a pipe: a thread copies it to the attempt's log file (best effort: a
full or read-only disk stops the copy, never the trainer) and keeps its last lines in memory, so a crash
message can quote the trainer's last error lines even when the log file could not be written or read.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any, BinaryIO

from contract.protocol import parse_event_line
from contract.storage import storage_writes

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
TAIL_LINES, TAIL_BYTES = 20, 4096  # what a crash message can quote of the trainer's stderr


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


class OutputTail:
    """The last lines of a stream, at most `lines` of them and `size` bytes (UTF-8) in all; thread-safe."""

    def __init__(self, lines: int = TAIL_LINES, size: int = TAIL_BYTES) -> None:
        self._lines: deque[str] = deque(maxlen=lines)
        self._size = size
        self._bytes = 0
        self._lock = threading.Lock()

    def add(self, line: str) -> None:
        line = line.rstrip("\r\n")
        encoded = line.encode("utf-8", errors="replace")
        if len(encoded) > self._size:  # one huge line: its end is the informative part
            line = encoded[-self._size :].decode("utf-8", errors="ignore")
            encoded = line.encode("utf-8")
        with self._lock:
            if len(self._lines) == self._lines.maxlen:
                self._bytes -= len(self._lines[0].encode("utf-8")) + 1
            self._lines.append(line)
            self._bytes += len(encoded) + 1
            while self._bytes > self._size and len(self._lines) > 1:
                self._bytes -= len(self._lines.popleft().encode("utf-8")) + 1

    def text(self) -> str:
        with self._lock:
            return "\n".join(self._lines).strip()


class TrainerProcess:
    """A supervised trainer: its events arrive on `events` (a queue of dicts; None marks end of output).

    Opening the log file is a storage write: a failure raises contract.storage.StorageError before anything
    is started. OSError from starting the process (no such interpreter) is raised as is.
    """

    def __init__(self, command: list[str], *, log_path: Path, env: dict[str, str] | None = None) -> None:
        with storage_writes(log_path):
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log: BinaryIO | None = open(log_path, "ab")  # noqa: SIM115 - closed in wait()
        self.log_path = log_path
        self.log_error: OSError | None = None  # why the copy to the log stopped, if it did
        self.stderr_tail = OutputTail()
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        try:
            self.proc = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        except BaseException:
            self._close_log()
            raise
        self._reader = threading.Thread(target=self._read, name="trainer-stdout", daemon=True)
        self._reader.start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, name="trainer-stderr", daemon=True)
        self._stderr_reader.start()
        self.stop_requested = False

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            event = parse_event_line(raw.decode("utf-8", errors="replace").rstrip("\n"))
            if event is not None:
                self.events.put(event)
        self.events.put(None)

    def _read_stderr(self) -> None:
        """Tees stderr: every line into the tail, and into the log file until a write to it fails."""
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr_tail.add(raw.decode("utf-8", errors="replace"))
            log = self._log
            if log is None:
                continue
            try:
                log.write(raw)
                log.flush()
            except (OSError, ValueError) as err:  # full, read-only (or closed): keep draining, stop copying
                self.log_error = err if isinstance(err, OSError) else None
                logger.warning(
                    "trainer log %s: write failed (%s); keeping its tail in memory", self.log_path, err
                )
                self._close_log()

    def _close_log(self) -> None:
        log, self._log = self._log, None
        if log is not None:
            with contextlib.suppress(OSError):
                log.close()

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
        self._stderr_reader.join(timeout=5)
        self._close_log()
        return code


def log_tail(path: Path, limit: int = 2000) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace").strip()
