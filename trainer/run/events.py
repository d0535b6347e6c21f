"""The run's event log: OUT/events.jsonl, one JSON object a line, and the callbacks (the worker's stdout).

On resume the events the interrupted run wrote after its checkpoint, and those that ended it, are dropped,
so the log reads as the uninterrupted run's. Writes go through contract.storage, so a full or read-only disk
is a StorageError naming the path.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from contract.protocol import EVENTS_FILE, EventType
from contract.storage import StorageError, storage_writes
from trainer.distributed.runtime import Reduce

EventCallback = Callable[[dict[str, Any]], None]

# On resume, the events after the checkpoint (logged again) and those that ended the interrupted run go.
_STEP_EVENTS = frozenset(
    {EventType.STEP, EventType.EVAL, EventType.CHECKPOINT, EventType.SAMPLES, EventType.WARNING}
)
_END_EVENTS = frozenset({EventType.FINISHED, EventType.ERROR, EventType.INTERRUPTED})


def _now() -> str:
    return datetime.now(UTC).isoformat()


class EventLog:
    """Appends events to OUT/events.jsonl (main process only) and hands them to the callbacks."""

    def __init__(self, out: Path, callbacks: Sequence[EventCallback], *, is_main: bool) -> None:
        self.out, self.callbacks, self.is_main = out, list(callbacks), is_main
        self._file: Any = None

    @property
    def is_open(self) -> bool:
        return self._file is not None

    def emit(self, event: dict[str, Any], *, best_effort: bool = False) -> None:
        """Appends the event to OUT/events.jsonl and hands it to the callbacks (the worker's stdout). A failed
        write raises StorageError, or with best_effort (the storage error's own event) is skipped, so the
        callbacks still get the event."""
        if not self.is_main:
            return
        event = {"time": _now(), **event}
        if self._file is not None:
            try:
                with storage_writes(self.out / EVENTS_FILE):
                    self._file.write(json.dumps(event, sort_keys=True) + "\n")
                    self._file.flush()
            except StorageError:
                if not best_effort:
                    raise
        for callback in self.callbacks:
            callback(event)

    def open(self, resume_step: int | None) -> None:
        if not self.is_main:
            return
        path = self.out / EVENTS_FILE
        with storage_writes(path):
            self._open_file(path, resume_step)

    def _open_file(self, path: Path, resume_step: int | None) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and path.exists():
            # Drop what the interrupted run wrote after the checkpoint it resumes from.
            kept = []
            for line in path.read_text().splitlines():
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if ev.get("type") in _STEP_EVENTS and ev.get("step", 0) > resume_step:
                    continue
                if ev.get("type") in _END_EVENTS:
                    continue
                kept.append(line)
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(k + "\n" for k in kept))
            os.replace(tmp, path)
        elif path.exists():
            path.unlink()
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115

    # ------------------------------------------------------------------ setup

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):  # the disk may be why we stop
                self._file.close()
            self._file = None


@contextlib.contextmanager
def stop_signals(request_stop: Callable[[int], None]) -> Iterator[None]:
    """SIGTERM and SIGINT call `request_stop(signum)` while the block runs (the run stops after the step in
    progress, with a checkpoint); the previous handlers come back after it. Off the main thread, nothing."""

    def handler(signum: int, _frame: Any) -> None:
        request_stop(signum)

    previous = {}
    if hasattr(signal, "SIGTERM"):
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not in the main thread
                previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class Interrupted(BaseException):
    """The run stops: after a step's checkpoint, or where it is while it loads (`StopPolicy.loading`). A
    BaseException, as KeyboardInterrupt: raised from a signal handler, it must not be taken for an error by
    an `except Exception` in the code it interrupts (a model loader's fallback, say)."""


class StopPolicy:
    """When the run stops after the step in progress, with a checkpoint. `request(signum)` comes from a
    signal handler (`stop_signals`) or a watcher thread (the Ray worker's relay poll); the engine calls
    `agreed(reduce)` once at every step's end, in every process at the same point (`reduce`: the runtime's
    reduction over the processes), and stops where it returns a signal number. This one answers from its
    own process: the right answer for one process.

    While the run loads (`loading`: reading the data and the model, the first evaluation, until the engine
    starts the step-0 checkpoint or, resumed, its first step) there is nothing to save (a fresh run has no
    checkpoint yet, a resumed one is at its last), so the signal handler stops the run at once
    (`interrupt_while_loading`) instead of after step 1: a job cancelled while its model loads ends in
    seconds (issue 46)."""

    def __init__(self) -> None:
        self.requested: int | None = None
        self.loading = True

    def request(self, signum: int) -> None:
        if self.requested is None:
            self.requested = int(signum)

    def interrupt_while_loading(self) -> None:
        """Raises Interrupted when a stop was requested and the run still loads (from the signal handler)."""
        if self.loading and self.requested is not None:
            raise Interrupted

    def agreed(self, reduce: Reduce) -> int | None:
        return self.requested


class AgreedStop(StopPolicy):
    """Above one process: the OR over every process, one all-reduce at each step's end, so every process
    stops after the same step even where the request reached them at different steps (the Ray relay is
    polled by each process; two could see it a step apart, and one would start a checkpoint's collectives
    while the other started the next step's). A process that was not asked itself stops with SIGTERM's
    number."""

    def agreed(self, reduce: Reduce) -> int | None:
        asked = float(reduce([1.0 if self.requested is not None else 0.0], "sum", torch.float64)[0])
        if asked == 0:
            return None
        return self.requested if self.requested is not None else int(signal.SIGTERM)


def stop_policy(world: int) -> StopPolicy:
    """The policy a run of `world` processes takes when none is given: agreed above one process."""
    return AgreedStop() if world > 1 else StopPolicy()
