"""A warm pool of sandboxed grader processes for one job: each loads the tenant's sources once and grades
many samples over a pipe (trainer/graders/harness.py speaks the protocol), one sample at a time, each
under its own time budget.

Each process is a sandbox of trainer/envs/sandbox.py (`launch`: bubblewrap namespaces, the seccomp filter,
rlimits, an unprivileged user, its own PID namespace ended by one SIGKILL to its init) running the grader
environment's interpreter, with that environment's site-packages, the harness and WordNet's database bound
read-only, and a private scratch tmpfs of disk_mb. Its limits: RLIMIT_AS memory_mb, RLIMIT_NPROC
processes, one sample at a time (one CPU), and the numerical libraries held to one thread.

- a sample that runs past timeout_s: its process is killed (the whole namespace) and the sample reported
  as a timeout; the next sample starts a fresh process. A process that dies (os._exit, a signal, out of
  memory) or answers anything but the reply to the sample it was given is killed the same way and the
  sample reported as crashed. Nothing a process did survives it: the pool never reuses one after a
  failure, and never across pools (one pool per job, or per request of the routes);
- CPU: RLIMIT_CPU is each process's lifetime backstop (LIFETIME_CPU_S); a process that has used most of
  it is retired and replaced between samples;
- the pool's processes start together and grade side by side: `grade` hands the samples out in order,
  each to the next free process, and returns the replies in the samples' order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from contract.graders import GraderLimitsSpec
from contract.spec import ToolLimitsSpec
from trainer.envs import sandbox, sandbox_processes, sandbox_runtime

VENV_ENV = "STARE_GRADER_VENV"  # the grader environment (default: .venv-graders beside the trainer)
DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".venv-graders"
HARNESS = Path(__file__).resolve().parent / "harness.py"
WORDNET = Path("/usr/share/wordnet")  # Debian's wordnet-base: METEOR's synonyms
LEXNAMES = (
    Path(__file__).resolve().parent / "wordnet-lexnames"
)  # WordNet's lexnames(5) list, as nltk reads it
IN_SANDBOX = {"site": "/grader/site-packages", "harness": "/grader/harness.py", "wordnet": "/grader/wordnet"}
LINKED_CACHE = ".sandbox-libraries.json"  # in the grader environment: what its extension modules link
LIFETIME_CPU_S = 600  # RLIMIT_CPU of one grader process (the sandbox's largest)
RETIRE_CPU_S = 500.0  # a process past this much CPU time is replaced between samples
MAX_REPLY_BYTES = 8 * 2**20
REAP_S = 5.0
# Loading: starting the sandbox, importing the libraries the grader uses and running its source once.
# OpenAI's 2 minutes, whatever the per-sample budget (a tight timeout_s must not refuse a grader that
# imports scipy on a busy machine).
SETUP_TIMEOUT_S = 120.0


class GraderUnavailable(RuntimeError):
    """The grader environment or the sandbox is missing here: no python or text_similarity grader runs."""


class GraderSetupError(ValueError):
    """The tenant's source did not load (it raised, defines no grade(sample, item), or timed out)."""

    def __init__(self, name: str, message: str, traceback: str = "", output: str = "") -> None:
        where = f"grader {name!r}" if name else "the grader"
        super().__init__(f"{where} did not load: {message}")
        self.name, self.message, self.traceback, self.output = name, message, traceback, output


@dataclasses.dataclass(frozen=True)
class Reply:
    """One sample's answer: per task {"score"} or {"error", "message", "traceback"}; or, when the process
    failed the whole sample, `failure` ("timeout" or "crashed") and no results."""

    results: list[dict[str, Any]]
    output: str = ""
    seconds: float = 0.0
    failure: str | None = None
    message: str = ""


def venv_path() -> Path:
    return Path(os.environ.get(VENV_ENV) or DEFAULT_VENV)


def _site_packages(venv: Path) -> Path | None:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    return found[0] if found else None


def unavailable() -> str | None:
    """None when python and text_similarity graders can run here, else why not (one line)."""
    venv = venv_path()
    if not (venv / "bin" / "python").exists() or _site_packages(venv) is None:
        return f"the grader environment {venv} is missing (scripts/build-grader-venv builds it)"
    problem = sandbox.available()
    return None if problem is None else f"the grader sandbox cannot start here: {problem}"


@functools.cache
def _runtime(venv: str) -> sandbox_runtime.Runtime:
    """The sandbox's runtime for the grader environment: its interpreter's, plus the site-packages, the
    harness, WordNet and the host libraries the packages' extension modules link."""
    interpreter = str((Path(venv) / "bin" / "python").resolve())
    base = sandbox_runtime.python_runtime(interpreter)
    site = _site_packages(Path(venv))
    if site is None:
        raise GraderUnavailable(f"the grader environment {venv} has no site-packages")
    binds = dict(base.binds)
    binds[IN_SANDBOX["site"]] = str(site.resolve())
    binds[IN_SANDBOX["harness"]] = str(HARNESS)
    if (WORDNET / "data.noun").is_file():  # file by file, with the lexnames file nltk's reader wants
        for path in sorted(WORDNET.iterdir()):
            if path.is_file():
                binds[f"{IN_SANDBOX['wordnet']}/{path.name}"] = str(path)
        binds[f"{IN_SANDBOX['wordnet']}/lexnames"] = str(LEXNAMES)
    site_root = str(site.resolve())
    added: set[str] = set()
    for lib in _linked_by_packages(Path(venv), site):
        real = str(Path(lib).resolve())
        if not real.startswith(site_root + "/"):  # the wheels' own libraries come with site-packages
            dest = str(Path(lib).parent.resolve() / Path(lib).name)
            binds.setdefault(dest, real)
            added.add(str(Path(dest).parent))
    paths = sorted(set(filter(None, base.library_path.split(":"))) | added)
    return dataclasses.replace(base, binds=tuple(sorted(binds.items())), library_path=":".join(paths))


def _linked_by_packages(venv: Path, site: Path) -> list[str]:
    """The libraries the packages' extension modules link (ldd over a few hundred files: seconds), kept in
    the environment's LINKED_CACHE for the list of modules it was made from; made and written when it is
    missing or stale (and the folder writable), else made in memory."""
    modules = sorted(str(path) for path in site.rglob("*.so*") if path.is_file())
    key = hashlib.sha256("\n".join(modules).encode()).hexdigest()
    cache = venv / LINKED_CACHE
    with contextlib.suppress(OSError, ValueError):
        kept = json.loads(cache.read_text())
        if kept.get("modules") == key and isinstance(kept.get("libraries"), list):
            return [str(lib) for lib in kept["libraries"]]
    libraries = sorted(sandbox_runtime.linked_libraries(modules))
    with contextlib.suppress(OSError):
        temporary = cache.with_name(cache.name + f".{os.getpid()}")
        temporary.write_text(json.dumps({"modules": key, "libraries": libraries}))
        temporary.chmod(0o644)
        os.replace(temporary, cache)
    return libraries


def library_list() -> list[str]:
    """The grader environment's linked libraries, worked out and kept now (scripts/build-grader-venv and
    the images call it once, where no sandbox may start)."""
    venv = venv_path().resolve()
    site = _site_packages(venv)
    if site is None:
        raise GraderUnavailable(f"the grader environment {venv} has no site-packages")
    return _linked_by_packages(venv, site)


def runtime() -> sandbox_runtime.Runtime:
    problem = unavailable()
    if problem is not None:
        raise GraderUnavailable(problem)
    return _runtime(str(venv_path().resolve()))


class GraderProcess:
    """One sandboxed harness: `start` sends the setup and waits for it to be ready; `ask` one sample."""

    def __init__(self, setup: dict[str, Any], limits: GraderLimitsSpec) -> None:
        self.setup, self.limits = setup, limits
        self.proc: subprocess.Popen[bytes] | None = None
        self.init: sandbox_processes.NamespaceInit | None = None
        self.cpu: sandbox_processes.CpuBudget | None = None
        self._buffer = bytearray()
        self._next_id = 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        limits = ToolLimitsSpec(
            cpu_seconds=LIFETIME_CPU_S,
            wall_seconds=LIFETIME_CPU_S,
            memory_mb=self.limits.memory_mb,
            processes=self.limits.processes,
            output_bytes=max(16, self.limits.output_bytes),
        )
        self.proc, self.init = sandbox.launch(
            runtime(), limits, scratch_mb=self.limits.disk_mb, program=[IN_SANDBOX["harness"]]
        )
        self.cpu = sandbox_processes.CpuBudget(self.init, float("inf"))
        self._buffer.clear()
        reply = self._exchange(self.setup, SETUP_TIMEOUT_S)
        if reply is None:
            self.kill()
            raise GraderSetupError("", f"loading the source ran past {SETUP_TIMEOUT_S:g} s")
        if reply.get("ready") is True:
            return
        self.kill()
        problem = reply.get("setup_error")
        if isinstance(problem, dict):
            raise GraderSetupError(
                str(problem.get("name", "")),
                str(problem.get("message", "")),
                str(problem.get("traceback", "")),
                str(reply.get("output", "")),
            )
        raise GraderSetupError("", f"the grader process did not start: {str(reply.get('line', ''))[:500]}")

    def ask(self, samples: list[list[dict[str, Any]]]) -> list[Reply]:
        """Grades the samples in order, each within timeout_s from the previous one's reply. Stops at the
        first sample that times out or crashes the process (its reply says so, the process is killed):
        the replies returned are those of the samples it reached, the rest are the caller's to ask again.
        A reply to an earlier request (a copy the grader forked, answering late) is skipped."""
        self._next_id += 1
        ident = self._next_id
        start = time.monotonic()
        if not self._send({"id": ident, "samples": samples}, start + self.limits.timeout_s):
            self.kill()
            return [Reply([], failure="crashed", message=self._crash_message({"eof": True}))]
        replies: list[Reply] = []
        while len(replies) < len(samples):
            reply = self._receive(start + self.limits.timeout_s)
            while reply is not None and _is_stale(reply, ident):
                reply = self._receive(start + self.limits.timeout_s)
            seconds = time.monotonic() - start
            if reply is None:
                self.kill()
                replies.append(Reply([], seconds=seconds, failure="timeout", message=self._timeout_message()))
                break
            results = reply.get("results")
            expected = len(samples[len(replies)])
            if (
                reply.get("id") != ident
                or reply.get("index") != len(replies)
                or not isinstance(results, list)
                or len(results) != expected
            ):
                self.kill()
                replies.append(
                    Reply([], seconds=seconds, failure="crashed", message=self._crash_message(reply))
                )
                break
            output = reply.get("output")
            replies.append(Reply(results, output if isinstance(output, str) else "", seconds))
            start = time.monotonic()
        return replies

    def _timeout_message(self) -> str:
        return f"grading ran past its budget of {self.limits.timeout_s:g} s; the grader process was killed"

    def _crash_message(self, reply: dict[str, Any]) -> str:
        if "line" in reply:
            return f"the grader process answered out of protocol: {str(reply['line'])[:300]!r}"
        if reply.get("eof"):
            code = self.proc.poll() if self.proc is not None else None
            how = "" if code is None else f" ({_exit_text(code)})"
            return f"the grader process died while grading{how}"
        return "the grader process answered a different request"

    def _exchange(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """Sends one message and reads one line back within `timeout_s` (the setup's exchange)."""
        deadline = time.monotonic() + timeout_s
        if not self._send(message, deadline):
            return {"eof": True}
        return self._receive(deadline)

    def _send(self, message: dict[str, Any], deadline: float) -> bool:
        """Writes one line by the deadline (a large batch may not fit the pipe: written as the harness
        reads); False when the process is gone or does not read it in time."""
        assert self.proc is not None and self.proc.stdin is not None
        data = memoryview(json.dumps(message).encode() + b"\n")
        fd = self.proc.stdin.fileno()
        os.set_blocking(fd, False)
        while data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            _, ready, _ = select.select([], [fd], [], remaining)
            if not ready:
                continue
            try:
                written = os.write(fd, data)
            except BlockingIOError:
                continue
            except OSError:  # BrokenPipeError: the process is gone
                return False
            data = data[written:]
        return True

    def _receive(self, deadline: float) -> dict[str, Any] | None:
        """One line by the deadline: the reply, {"eof": True} when the process ended, {"line": text} for a
        line that is not a JSON object; None on timeout."""
        assert self.proc is not None and self.proc.stdout is not None
        line = self._read_line(self.proc.stdout.fileno(), deadline)
        if line is None or isinstance(line, dict):
            return line
        try:
            reply = json.loads(line)
        except ValueError:
            return {"line": line.decode("utf-8", "replace")}
        return reply if isinstance(reply, dict) else {"line": line.decode("utf-8", "replace")}

    def _read_line(self, fd: int, deadline: float) -> bytes | dict[str, Any] | None:
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return {"eof": True}
            self._buffer += chunk
            if len(self._buffer) > MAX_REPLY_BYTES:
                return {"line": bytes(self._buffer[:300])}
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        return line

    def worn_out(self) -> bool:
        if self.cpu is None:
            return False
        self.cpu.sample()
        return self.cpu.used >= RETIRE_CPU_S

    def kill(self) -> None:
        """Ends the process's PID namespace (everything it started) and reaps bwrap."""
        proc, init = self.proc, self.init
        self.proc = self.init = None
        if init is not None:
            init.kill()
        if proc is not None:
            try:
                proc.wait(timeout=REAP_S)
            except subprocess.TimeoutExpired:
                sandbox_processes.with_group(proc.pid, signal.SIGKILL)
                proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    if pipe is not None:
                        pipe.close()
        if init is not None:
            init.close()


def _is_stale(reply: dict[str, Any], ident: int) -> bool:
    earlier = reply.get("id")
    return isinstance(earlier, int) and not isinstance(earlier, bool) and 0 < earlier < ident


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    if code > 128 and code - 128 < 65:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(code - 128).name}"
    return f"exit code {code}"


class GraderPool:
    """`workers` grader processes of one setup (one job's sources). `start` loads them side by side and
    raises GraderSetupError when the source does not load; `grade` answers many samples; `close` ends
    every process."""

    def __init__(self, setup: dict[str, Any], limits: GraderLimitsSpec, workers: int) -> None:
        self.setup, self.limits = setup, limits
        self._slots = [GraderProcess(setup, limits) for _ in range(workers)]
        self._free = list(self._slots)
        self._lock = threading.Condition()
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stare-grader")
        self.started = 0  # processes started so far (a replacement counts)
        self.closed = False

    def start(self) -> None:
        failures = [error for error in self._executor.map(self._start_one, self._slots) if error]
        if failures:
            self.close()
            raise failures[0]

    def _start_one(self, slot: GraderProcess) -> GraderSetupError | None:
        try:
            slot.start()
        except GraderSetupError as err:
            return err
        with self._lock:
            self.started += 1
        return None

    def _take(self) -> GraderProcess:
        with self._lock:
            while not self._free:
                self._lock.wait()
            return self._free.pop()

    def _give(self, slot: GraderProcess) -> None:
        with self._lock:
            self._free.append(slot)
            self._lock.notify()

    def _grade_chunk(self, samples: list[list[dict[str, Any]]]) -> list[Reply]:
        """A run of samples on one process, in order: after a sample that timed out or crashed it, the
        rest go to a fresh process."""
        slot = self._take()
        replies: list[Reply] = []
        try:
            while len(replies) < len(samples):
                if slot.alive and slot.worn_out():
                    slot.kill()
                if not slot.alive:
                    slot.kill()
                    try:
                        slot.start()
                    except (
                        GraderSetupError
                    ) as err:  # it loaded before: a failure of this start, this sample's
                        replies.append(Reply([], failure="crashed", message=str(err)))
                        continue
                    with self._lock:
                        self.started += 1
                replies.extend(slot.ask(samples[len(replies) :]))
            return replies
        finally:
            self._give(slot)

    def grade(self, samples: list[list[dict[str, Any]]]) -> list[Reply]:
        """Each sample's reply, in order (samples with no tasks get an empty reply). The samples are cut
        into one run per process, graded side by side."""
        if self.closed:
            raise RuntimeError("the grader pool is closed")
        asked = [index for index, tasks in enumerate(samples) if tasks]
        replies = [Reply([]) for _ in samples]
        size = -(-len(asked) // len(self._slots)) if asked else 0
        runs = [asked[start : start + size] for start in range(0, len(asked), size)] if size else []
        for run, graded in zip(
            runs, self._executor.map(self._grade_chunk, [[samples[i] for i in r] for r in runs])
        ):
            for index, reply in zip(run, graded):
                replies[index] = reply
        return replies

    def close(self) -> None:
        self.closed = True
        self._executor.shutdown(wait=True)
        for slot in self._slots:
            slot.kill()

    def __enter__(self) -> GraderPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


PoolFactory = Callable[[dict[str, Any], GraderLimitsSpec, int], GraderPool]
