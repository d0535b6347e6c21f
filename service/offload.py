"""CPU-bound work a request reaches (task generation, a verifier's dry run), in child processes with a
wall-clock budget and a memory limit, never in the API process and never on its event loop.

A reasoning-gym task can loop forever on some params (puzzle24 with min_value = max_value = 1), take
seconds (futoshiki at difficulty 3), allocate without bound (count_primes up to 1e10) or raise anything;
a scorer can be slow on a hostile completion. Run on the event loop, one such request stalled every
tenant. Here each call goes to a warm child (spawned, so it shares nothing with the API's threads and
descriptors; the task and verifier modules imported once) and the event loop only awaits it:

- the budget: the parent waits `seconds` for the answer, then kills that child (SIGKILL) and starts a
  replacement; the request gets `BudgetExceeded` naming the phase it was in (the caller turns it into a
  422 naming the field);
- memory: the child runs under RLIMIT_AS `memory_mb`; a MemoryError is reported the same way and the child
  is replaced;
- a child that dies (a signal, a crash in C) is `ChildFailed`, and replaced;
- at most `workers` calls run at once; more wait their turn without holding a thread.

A child is a resource boundary, not a privilege boundary: it runs as the API's user. What keeps tenant
text from running as code is that no path from a request reaches an eval (docs/SECURITY.md, "Eval-like
paths"); the child keeps a hostile input from stalling or exhausting the API.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import anyio
import anyio.to_thread

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
START_TIMEOUT_S = 120.0  # spawning a child and importing the task modules (about 2 s on an idle core)
# Set in the child before anything imports numpy: one thread each, and a small address space.
_CHILD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class BudgetExceeded(Exception):
    """The call ran past its wall clock or its memory; `phase` is what it was doing (a request field)."""

    def __init__(self, message: str, phase: str) -> None:
        super().__init__(message)
        self.phase = phase


class ChildFailed(Exception):
    """The child died without an answer (a signal, a crash); `phase` as for BudgetExceeded."""

    def __init__(self, message: str, phase: str) -> None:
        super().__init__(message)
        self.phase = phase


class CallError(Exception):
    """The function raised in the child: `kind` is the exception's type name, `value_error` whether it is
    a ValueError (or TypeError), i.e. a refusal of the input rather than a failure of the code."""

    def __init__(self, kind: str, message: str, *, value_error: bool, phase: str) -> None:
        super().__init__(f"{kind}: {message}" if not value_error else message)
        self.kind = kind
        self.value_error = value_error
        self.phase = phase


# --- the child --------------------------------------------------------------------------------------------


def _serve(conn: Connection, memory_bytes: int) -> None:
    """The child's loop: import once, then answer (function, args) requests."""
    os.environ.update(_CHILD_ENV)
    for name in [name for name in os.environ if name.startswith("STARE_")]:
        del os.environ[name]  # nothing here needs the service's settings
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    from service import offload_jobs

    offload_jobs.warm()
    conn.send(("ready",))
    while True:
        try:
            function, args = conn.recv()
        except EOFError:
            return

        def report(new_phase: str) -> None:
            conn.send(("phase", new_phase))

        try:
            value = offload_jobs.FUNCTIONS[function](report, *args)
        except MemoryError:
            conn.send(("memory", None))
            return  # a child that ran out of memory is not reused
        except RecursionError as exc:
            conn.send(("error", "RecursionError", str(exc)[:500], False))
            return
        except Exception as exc:
            value_error = isinstance(exc, (ValueError, TypeError))
            conn.send(("error", type(exc).__name__, str(exc)[:2000], value_error))
        else:
            conn.send(("ok", value))


# --- the parent -------------------------------------------------------------------------------------------


class _Child:
    def __init__(self, memory_bytes: int) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.conn, child_end = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(child_end, memory_bytes), name="stare-offload", daemon=True
        )
        self.process.start()
        child_end.close()
        self.ready = False

    def wait_ready(self, timeout: float) -> None:
        if not self.conn.poll(timeout):
            self.kill()
            raise ChildFailed(f"a task-checking process did not start within {timeout:g} s", "startup")
        try:
            message = self.conn.recv()
        except EOFError:
            self.kill()
            raise ChildFailed("a task-checking process died while starting", "startup") from None
        self.ready = message == ("ready",)

    def call(self, function: str, args: tuple[Any, ...], phase: str, seconds: float, memory_mb: int) -> Any:
        """The function's value; raises BudgetExceeded, ChildFailed or CallError (the child is then either
        dead or still fit for reuse, see `alive`)."""
        self.conn.send((function, args))
        deadline = time.monotonic() + seconds
        while True:
            remaining = deadline - time.monotonic()
            try:
                ready = remaining > 0 and self.conn.poll(remaining)
                message = self.conn.recv() if ready else None
            except (EOFError, OSError):
                self.kill()
                code = self.process.exitcode
                raise ChildFailed(f"the process checking it died (exit {code})", phase) from None
            if message is None:
                self.kill()
                raise BudgetExceeded(f"it ran past its budget of {seconds:g} s and was stopped", phase)
            kind = message[0]
            if kind == "phase":
                phase = message[1]
            elif kind == "ok":
                return message[1]
            elif kind == "memory":
                self.kill()
                raise BudgetExceeded(f"it needed more than its budget of {memory_mb} MiB of memory", phase)
            else:
                _, name, text, value_error = message
                if name == "RecursionError":
                    self.kill()
                raise CallError(name, text, value_error=value_error, phase=phase)

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
            self.process.join(5)
        with contextlib.suppress(Exception):
            self.conn.close()


class ChildPool:
    """Up to `workers` warm children; `await run(function, *args, phase=...)` from the event loop."""

    def __init__(self, *, workers: int, seconds: float, memory_mb: int) -> None:
        self.workers, self.seconds, self.memory_mb = workers, seconds, memory_mb
        self._idle: list[_Child] = []
        self._lock = threading.Lock()
        self._closed = False
        self._users = 0  # open lifespans (open() / close())
        self._gate: anyio.Semaphore | None = None

    def _take(self) -> _Child:
        with self._lock:
            while self._idle:
                child = self._idle.pop()
                if child.alive:
                    return child
                child.kill()
        child = _Child(self.memory_mb * MIB)
        child.wait_ready(START_TIMEOUT_S)
        return child

    def _give_back(self, child: _Child) -> None:
        with self._lock:
            if not self._closed and child.alive and len(self._idle) < self.workers:
                self._idle.append(child)
                return
        child.kill()

    def _run_blocking(self, function: str, args: tuple[Any, ...], phase: str) -> Any:
        child = self._take()
        try:
            return child.call(function, args, phase, self.seconds, self.memory_mb)
        finally:
            self._give_back(child)

    async def run(self, function: str, *args: Any, phase: str) -> Any:
        """Run offload_jobs.FUNCTIONS[function](report, *args) in a child; `phase` names what it does until
        the function reports another. Raises BudgetExceeded, ChildFailed or CallError."""
        if self._closed:
            raise ChildFailed("the service is shutting down", phase)
        if self._gate is None:
            self._gate = anyio.Semaphore(self.workers)
        async with self._gate:
            return await anyio.to_thread.run_sync(self._run_blocking, function, args, phase)

    def open(self) -> None:
        """An app's lifespan starts: the pool takes calls (again, if it was closed). Lifespans of one app can
        nest (a second test client on it), so each open is matched by one close, and the last one closes."""
        with self._lock:
            self._users += 1
            if self._closed:
                self._closed, self._gate = False, None

    def prewarm(self) -> None:
        """Start the children now, in a background thread (the first requests then pay no spawn)."""

        def start() -> None:
            started = []
            for _ in range(self.workers):
                try:
                    started.append(self._take())
                except ChildFailed:
                    logger.warning("a task-checking process did not start", exc_info=True)
            for child in started:
                self._give_back(child)

        threading.Thread(target=start, name="stare-offload-prewarm", daemon=True).start()

    def close(self) -> None:
        with self._lock:
            self._users = max(0, self._users - 1)
            if self._users:
                return  # another lifespan of the same app still serves
            self._closed = True
            idle, self._idle = self._idle, []
        for child in idle:
            child.kill()
