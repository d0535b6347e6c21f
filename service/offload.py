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
- at most `workers` calls run at once, at most one per tenant (service/fairness.py): a tenant's further
  calls wait in its own queue, bounded (`QueueBusy` past it: a 429), and a freed child goes to the
  waiting tenant served least recently, so one tenant's slow checks delay only that tenant;
- confinement (service/offload_confine.py): the child runs under bubblewrap and sees only the interpreter,
  the virtual environment and our source, read-only; no host file, no network, no /proc, no keyring. So a
  config field that names a file (reasoning-gym's `data_file`, refused by trainer/tasks/rg_config.py) would
  find nothing even if it were missed. `confine=False` (STARE_TASK_CHECK_ISOLATION=false) turns it off;
  where bwrap cannot start, a call is `Unavailable` (503) rather than run unconfined.

What keeps tenant text from running as code is that no path from a request reaches an eval (docs/SECURITY.md,
"Eval-like paths"); the child keeps a hostile input from stalling or exhausting the API, and from reading
the host. Error texts from the child are ours: an exception of a dependency comes back as its kind only,
never its message (it may name files).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import anyio
import anyio.to_thread

from service import offload_confine
from service.fairness import FairGate, QueueFull

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
    a ValueError (or TypeError), i.e. a refusal of the input rather than a failure of the code. Only our
    own refusals (`offload_jobs.Refusal`) carry their message; anything else reads as a stable sentence
    (a dependency's message may name files: issue 44, R1), its kind kept for the log."""

    def __init__(self, kind: str, message: str, *, value_error: bool, phase: str) -> None:
        super().__init__(message or "the check failed on this input")
        self.kind = kind
        self.value_error = value_error
        self.phase = phase


class Unavailable(Exception):
    """No child can run here (bubblewrap missing or failing with confinement on): the service's fault."""


QueueBusy = QueueFull  # a tenant's queue of checks is full (a 429)


# --- the child --------------------------------------------------------------------------------------------


def serve_fd(fd: int, memory_bytes: int) -> None:
    """The child's entry point (`python -c`): answer requests on the socket `fd` until it closes."""
    _serve(Connection(fd), memory_bytes)


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
            ours = isinstance(exc, offload_jobs.Refusal)
            conn.send(("error", type(exc).__name__, str(exc)[:2000] if ours else "", value_error))
        else:
            conn.send(("ok", value))


# --- the parent -------------------------------------------------------------------------------------------


class _Child:
    """One child: `python -c 'serve_fd(...)'`, under bwrap when `confine`, over a socket pair."""

    def __init__(self, memory_bytes: int, *, confine: bool) -> None:
        parent_end, child_end = socket.socketpair()
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - read on a failed start, closed in kill()
        fds = [child_end.fileno()]
        code = f"from service.offload import serve_fd; serve_fd({child_end.fileno()}, {memory_bytes})"
        argv = [sys.executable, "-c", code]
        try:
            if confine:
                filter_read, filter_write = os.pipe()
                os.write(filter_write, offload_confine.seccomp_program())  # under 2 KiB: fits the pipe
                os.close(filter_write)
                fds.append(filter_read)
                argv = offload_confine.confined_argv(argv, filter_read)
            env = None if confine else {**os.environ, "PYTHONPATH": _python_path()}
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self.stderr,
                pass_fds=tuple(fds),
                env=env,
                cwd="/",
                start_new_session=True,
            )
        finally:
            for fd in fds[1:]:
                os.close(fd)
            child_end.close()
        self.conn = Connection(parent_end.detach())
        self.ready = False

    def wait_ready(self, timeout: float) -> None:
        if not self.conn.poll(timeout):
            self.kill()
            raise ChildFailed(f"a task-checking process did not start within {timeout:g} s", "startup")
        try:
            message = self.conn.recv()
        except EOFError:
            logger.warning("a task-checking process died while starting: %s", self._stderr_tail())
            self.kill()
            raise ChildFailed("a task-checking process died while starting", "startup") from None
        self.ready = message == ("ready",)

    def _stderr_tail(self) -> str:
        with contextlib.suppress(OSError):
            self.stderr.seek(0, os.SEEK_END)
            self.stderr.seek(max(0, self.stderr.tell() - 2000))
            return self.stderr.read().decode("utf-8", "replace").strip()
        return ""

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
                code = self.process.returncode
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
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL to bwrap (or the child): with --die-with-parent the child and its namespace go too."""
        with contextlib.suppress(Exception):
            self.process.kill()
            self.process.wait(5)
        with contextlib.suppress(Exception):
            self.conn.close()
        with contextlib.suppress(Exception):
            self.stderr.close()


def _python_path() -> str:
    """Unconfined: the child imports our packages from where this process does."""
    roots = [str(root) for root in offload_confine._source_roots()]
    extra = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return os.pathsep.join(dict.fromkeys(roots + extra))


class ChildPool:
    """Up to `workers` warm children; `await run(function, *args, phase=..., tenant=...)` from the event loop.
    `queue`: how many calls of one tenant may wait while its one call runs (more: QueueBusy)."""

    def __init__(
        self, *, workers: int, seconds: float, memory_mb: int, queue: int = 4, confine: bool = True
    ) -> None:
        self.workers, self.seconds, self.memory_mb = workers, seconds, memory_mb
        self.queue, self.confine = queue, confine
        self._idle: list[_Child] = []
        self._lock = threading.Lock()
        self._closed = False
        self._users = 0  # open lifespans (open() / close())
        self._gate: FairGate | None = None

    def _take(self) -> _Child:
        with self._lock:
            while self._idle:
                child = self._idle.pop()
                if child.alive:
                    return child
                child.kill()
        if self.confine:
            problem = offload_confine.confinement_problem()
            if problem is not None:
                raise Unavailable(
                    f"task checks cannot be confined on this server ({problem}); the operator installs "
                    "bubblewrap or sets STARE_TASK_CHECK_ISOLATION=false"
                )
        child = _Child(self.memory_mb * MIB, confine=self.confine)
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

    async def run(self, function: str, *args: Any, phase: str, tenant: str = "") -> Any:
        """Run offload_jobs.FUNCTIONS[function](report, *args) in a child; `phase` names what it does until
        the function reports another; `tenant` is whose call it is (one at a time each). Raises
        BudgetExceeded, ChildFailed, CallError, QueueBusy or Unavailable."""
        if self._closed:
            raise ChildFailed("the service is shutting down", phase)
        if self._gate is None:
            self._gate = FairGate(self.workers, self.queue)
        async with self._gate.hold(tenant):
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
                except (ChildFailed, Unavailable):
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
