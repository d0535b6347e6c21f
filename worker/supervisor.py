"""Runs the trainer as a child process and turns its stdout event lines into Python dicts.

The child is `python -m trainer run SPEC --out DIR --events-stdout [--resume]` (or the same under
`torchrun` when the spec asks for several processes on one node, or the Ray driver
`python -m trainer.launch.ray_driver run ...` for a job over several nodes). It gets SIGKILL if the worker process dies
(PR_SET_PDEATHSIG), so a killed worker never leaves a trainer running behind a lost lease. Cooperative
stop: SIGTERM makes the trainer checkpoint and exit 75.

The child's environment is an allow-list (`trainer_environment`, docs/SECURITY.md): it talks to the worker
through its stdout events (contract/protocol.py), never the database or the broker, so their URLs, the
service's keys and anything else secret in the worker's environment stay out of it, and out of what its
tools could ever print. It gets the process basics (PATH, HOME, locale, TMPDIR), Python's own variables,
the thread, GPU and Hugging Face cache/offline settings, and the STARE_* variables the trainer reads.

Exit codes under torchrun: torchrun exits 1 whenever one of its processes fails, so a 2 (user error), 3
(non-finite) or 75 (stopped) of the trainer would read as a crash. Its first failed process's code comes back
through torch's own error files instead (contract.protocol: each failing trainer process writes its exit
report where torchrun tells it to, torchrun copies the first one into the file named by the
TORCHELASTIC_ERROR_FILE we give it, adding that process's exit code), and `TrainerProcess.wait` returns that
code for torchrun's 1. The first failure is the cause: torchrun stops the other processes the moment one
fails, so theirs are mostly its SIGTERM. torchrun waits `--shutdown-timeout` for its processes after a
SIGTERM of its own (the cooperative stop reaches it too) before it SIGKILLs them: the stop grace, so a
checkpoint in progress is not cut short before the worker itself would give up on it.

Confined (the worker's default, worker/isolation.py), the child is bubblewrap around that command: the
trainer (or torchrun, or the Ray driver) is pid 1 of its own PID namespace and leads its own session. bwrap's
--info-fd gives its pid, held as a pidfd: the cooperative SIGTERM goes to its process group (the trainer and
torchrun's processes, not bwrap's monitor), SIGKILL to it (the kernel then ends every process of the job),
and bwrap's 128 + n for a death by signal n comes back as -n, as for an unconfined child.

The trainer's stderr comes through a pipe: a thread copies it to the attempt's log file (best effort: a
full or read-only disk stops the copy, never the trainer) and keeps its last lines in memory, so a crash
message can quote the trainer's last error lines even when the log file could not be written or read.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from contract.protocol import ERROR_FILE_ENV, ExitCode, ExitReport, parse_event_line, read_exit_report
from contract.storage import storage_writes
from worker.isolation import Confinement, confined_command, filter_fd, prepare, read_child_pid

logger = logging.getLogger(__name__)


class RaySettings(Protocol):  # worker.settings.WorkerSettings' ray_* fields
    ray_address: str
    ray_connect_timeout_s: float
    ray_start_timeout_s: float
    ray_health_timeout_s: float
    ray_cpus_per_worker: float
    ray_gpus_per_worker: float


PR_SET_PDEATHSIG = 1
REAP_S = 10.0  # how long bwrap has to reap a killed trainer before its own group is killed
TAIL_LINES, TAIL_BYTES = 20, 4096  # what a crash message can quote of the trainer's stderr


# The STARE_* variables the trainer reads (and nothing of the service's: no STARE_DATABASE_URL, no keys).
TRAINER_STARE_VARS = frozenset(
    {
        "STARE_MODEL_CACHE",  # trainer/models.py: where models are cached
        "STARE_KERNEL_BACKEND",  # trainer/algos/kernels.py: torch or triton
        "STARE_HEAP_TUNING",  # trainer/run/heap.py: 0 turns the allocator tuning off
        "STARE_BWRAP",  # trainer/envs/sandbox.py: the python tool's bubblewrap
        "STARE_TOOL_PYTHON",  # trainer/envs/sandbox.py: the python tool's interpreter
        "STARE_TOOL_UID",  # trainer/envs/sandbox.py: the user a root trainer runs tool calls as
        "STARE_GRADER_VENV",  # trainer/graders/pool.py: the grader environment a python grader imports from
        "STARE_INJECT_NAN_STEP",  # trainer/run/faults.py: fault injection (tests)
        "STARE_INJECT_CRASH_STEP",  # trainer/run/faults.py: fault injection (tests)
        "STARE_STEP_DELAY_S",  # trainer/run/faults.py: slow steps (fault tests)
        "STARE_LOAD_DELAY_S",  # trainer/run/faults.py: a slow model load (fault tests)
    }
)
TRAINER_ENV_NAMES = TRAINER_STARE_VARS | frozenset(
    {
        # the process: where programs and the home are, the locale and time zone, temporary files
        *("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH"),
        # Python: the import path (a source checkout), hashing, output, warnings, the virtual environment
        *("PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS"),
        *("PYTHONFAULTHANDLER", "PYTHONIOENCODING", "PYTHONUTF8", "VIRTUAL_ENV"),
        # caches torch, triton and the tokenizers write (kernels, compiled graphs)
        *("XDG_CACHE_HOME", "TOKENIZERS_PARALLELISM", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
        # Hugging Face: where models and data sets are cached, and staying offline
        *("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"),
        *("HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_OFFLINE"),
        *("TRANSFORMERS_CACHE", "TRANSFORMERS_VERBOSITY"),
    }
)
# Families of tuning variables (threads, GPUs, collectives, compilers), passed whole...
TRAINER_ENV_PREFIXES = (
    *("LC_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "CUDA_", "NVIDIA_", "NCCL_", "CUBLAS_", "CUDNN_"),
    *("TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "TRITON_", "ACCELERATE_"),
    "RAY_",  # the Ray driver's own settings (RAY_USAGE_STATS_ENABLED, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER, ...)
)
# ...except a name that looks like a credential, whatever its family.
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSW", "CREDENTIAL", "KEY", "AUTH", "_URL", "_URI", "_DSN", "COOKIE")


def trainer_environment(parent: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The trainer child's environment: the allow-listed part of `parent`, then `extra`."""
    env = {}
    for name, value in parent.items():
        if name in TRAINER_ENV_NAMES or (
            name.startswith(TRAINER_ENV_PREFIXES) and not any(word in name for word in _SECRET_WORDS)
        ):
            env[name] = value
    env.update(extra or {})
    return env


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    os.setsid()  # own process group: signals reach torchrun's children too


def _catches(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler installed for `sig` (SigCgt of /proc/PID/status); True when that
    cannot be read (then the signal is sent as it would be without the check)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return True


def _parent_of(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        return int(text[text.rfind(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


TORCHRUN = "torch.distributed.run"


def run_arguments(spec_path: Path, out_dir: Path, *, resume: bool) -> list[str]:
    """The `run` command's arguments, as trainer.launch.command.add_run_arguments declares them: the same for
    `python -m trainer` (alone or under torchrun) and for the Ray driver."""
    args = ["run", str(spec_path), "--out", str(out_dir), "--no-progress", "--events-stdout"]
    return [*args, "--resume"] if resume else args


def trainer_command(
    python: str,
    spec_path: Path,
    out_dir: Path,
    *,
    resume: bool,
    num_processes: int,
    stop_grace_s: float = 30.0,
) -> list[str]:
    """The trainer's command line; above one process under torchrun, which waits stop_grace_s for its
    processes to stop after a SIGTERM before it SIGKILLs them."""
    args = run_arguments(spec_path, out_dir, resume=resume)
    if num_processes > 1:
        # torchrun (torch's own launcher) on this node: the trainer's processes find each other through
        # its local rendezvous (--standalone: a free port, no fixed address), one agent per job.
        return [
            python,
            "-m",
            TORCHRUN,
            "--standalone",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(num_processes),
            "--shutdown-timeout",
            str(math.ceil(stop_grace_s)),
            "-m",
            "trainer",
            *args,
        ]
    return [python, "-m", "trainer", *args]


def runs_torchrun(command: list[str]) -> bool:
    return command[1:3] == ["-m", TORCHRUN]


def launched_exit_code(code: int, report: ExitReport | None) -> int:
    """The trainer's exit code: torchrun's own, except its 1 when its first failed process reported a code."""
    if code == ExitCode.FAILED and report is not None and report.code > 0:
        return report.code
    return code


def ray_command(
    python: str, spec_path: Path, out_dir: Path, *, resume: bool, settings: RaySettings
) -> list[str]:
    """The Ray driver for a multi-node job (trainer/launch/ray_driver.py): the same arguments and output as
    `python -m trainer run`, plus the cluster's address, timeouts and per-process resources."""
    args = run_arguments(spec_path, out_dir, resume=resume)
    return [
        python,
        "-m",
        "trainer.launch.ray_driver",
        *args,
        *("--address", settings.ray_address),
        *("--connect-timeout-s", str(settings.ray_connect_timeout_s)),
        *("--start-timeout-s", str(settings.ray_start_timeout_s)),
        *("--health-timeout-s", str(settings.ray_health_timeout_s)),
        *("--cpus-per-worker", str(settings.ray_cpus_per_worker)),
        *("--gpus-per-worker", str(settings.ray_gpus_per_worker)),
    ]


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
    Its environment is `trainer_environment(os.environ, env)`: `env` adds to the allow-listed part.

    Opening the log file is a storage write: a failure raises contract.storage.StorageError before anything
    is started. OSError from starting the process (no such interpreter) is raised as is.

    `error_file` (a torchrun command): where torchrun writes its first failed process's exit report; `wait`
    then returns that process's code for torchrun's 1, and `exit_report` holds the report.
    """

    def __init__(
        self,
        command: list[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        error_file: Path | None = None,
        confinement: Confinement | None = None,
    ) -> None:
        self.error_file = error_file
        self.exit_report: ExitReport | None = None
        self.confined = confinement is not None
        with storage_writes(log_path):
            log_path.parent.mkdir(parents=True, exist_ok=True)
            if error_file is not None:
                error_file.unlink(missing_ok=True)  # an earlier launch's
                env = {**(env or {}), ERROR_FILE_ENV: str(error_file)}
            self._log: BinaryIO | None = open(log_path, "ab")  # noqa: SIM115 - closed in wait()
        self.log_path = log_path
        self.log_error: OSError | None = None  # why the copy to the log stopped, if it did
        self.stderr_tail = OutputTail()
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        # Confined: the trainer is the init of its PID namespace, and the leader of its process group.
        self._init_pid: int | None = None
        self._init_fd: int | None = None
        self._start(command, trainer_environment(os.environ, env), confinement)
        self._reader = threading.Thread(target=self._read, name="trainer-stdout", daemon=True)
        self._reader.start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, name="trainer-stderr", daemon=True)
        self._stderr_reader.start()
        self.stop_requested = False
        self._stop_delivered = False

    def _start(self, command: list[str], child_env: dict[str, str], confinement: Confinement | None) -> None:
        """Start the trainer (confined: under bwrap, as its own uid, with a private keyring) and, confined,
        hold its PID namespace's init."""
        if confinement is not None:
            # Under bwrap a missing interpreter would be bwrap's exit 1, read as a crash of the trainer:
            # checked here, it is the same OSError as an unconfined start (the worker's "cannot start").
            _check_executable(command[0])
        info_read, info_write = os.pipe() if confinement is not None else (-1, -1)
        seccomp = -1
        try:
            if confinement is not None:
                prepare(confinement, child_env)  # a root worker's trainer runs as its own uid: its folders
                seccomp = filter_fd()  # a private keyring (docs/SECURITY.md)
                command = confined_command(command, confinement, child_env, info_write, seccomp)
            self.proc = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                env=child_env,
                pass_fds=(info_write, seccomp) if confinement is not None else (),
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        except BaseException:
            self._close_log()
            for fd in (info_read, info_write):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            if seccomp >= 0:
                os.close(seccomp)
        if confinement is not None:
            os.close(info_write)
            try:
                self._hold_init(read_child_pid(info_read))
            finally:
                os.close(info_read)

    def _hold_init(self, pid: int | None) -> None:
        """A pidfd of the confined trainer (opened while bwrap is its parent: not a reused pid)."""
        if pid is None:
            return
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return
        if _parent_of(pid) != self.proc.pid:
            os.close(pidfd)
            return
        self._init_pid, self._init_fd = pid, pidfd

    def _signal_trainer(self, sig: int) -> bool:
        """Confined: `sig` to the trainer's process group (SIGKILL: to the init, which ends the namespace);
        False when there is no such trainer (not confined, or bwrap never started it)."""
        if self._init_fd is None or self._init_pid is None:
            return False
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self._init_fd, 0)  # alive still: the group's id is its pid
            if sig == signal.SIGKILL:  # the namespace's init: every process of it (and of its group)
                signal.pidfd_send_signal(self._init_fd, sig)
            os.killpg(self._init_pid, sig)
        return True

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
        """Cooperative stop: the trainer checkpoints and exits 75. Call it again until the child exits: a
        confined trainer is the init of its PID namespace, and the kernel drops a signal to an init that has
        no handler for it, so while the trainer is still starting (its SIGTERM handler not installed yet)
        the SIGTERM is held back and sent on a later call, once, when the trainer catches it."""
        if self.proc.poll() is not None:
            return
        self.stop_requested = True
        if self._stop_delivered:
            return
        if self._init_pid is not None and not _catches(self._init_pid, signal.SIGTERM):
            return  # not yet: it would be dropped
        if not self._signal_trainer(signal.SIGTERM):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
        self._stop_delivered = True

    def kill(self) -> None:
        if self.proc.poll() is None:
            if self._signal_trainer(signal.SIGKILL):  # bwrap then reaps it and exits 128 + 9
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=REAP_S)
                    return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        """The trainer's exit code (under torchrun: see `launched_exit_code`)."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        self._stderr_reader.join(timeout=5)
        self._close_log()
        if self._init_fd is not None:
            os.close(self._init_fd)
            self._init_fd = None
        # bwrap reports its child's death by signal n as 128 + n: the supervisor's codes say -n, as unconfined.
        if self.confined and 128 < code < 128 + 65:
            code = 128 - code
        if self.error_file is not None:
            with contextlib.suppress(OSError):
                self.exit_report = read_exit_report(self.error_file.read_text(errors="replace"))
        return launched_exit_code(code, self.exit_report)


def log_tail(path: Path, limit: int = 2000) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace").strip()


def _check_executable(program: str) -> None:
    """FileNotFoundError or PermissionError, as Popen would raise them, for a program that cannot run."""
    path = program if os.sep in program else shutil.which(program)
    if path is None or not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    if not os.access(path, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
