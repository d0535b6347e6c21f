"""The Python code tool's sandbox: bubblewrap (bwrap) around the interpreter, with rlimits and a wall clock.

One call = one fresh sandbox, a least-privilege boundary (docs/TOOLS.md has each layer; docs/SECURITY.md
what it promises and the tests that hold it to that):
- namespaces: `--unshare-all` (user, pid, net, ipc, uts, cgroup): no network but an empty loopback, no view
  of the host's processes; `--as-pid-1`: the interpreter is the namespace's only process at start (no bwrap
  helper inside whose /proc/1/environ or memory it could read); `--disable-userns`: no nested user
  namespace; `--die-with-parent` and `--new-session` (no terminal injection);
- environment: prlimit and bwrap are started with an empty environment, and the program gets only HOME
  and TMPDIR (/work) and LD_LIBRARY_PATH: nothing of the trainer's environment exists anywhere inside;
- file system: only the interpreter, its standard library (site-packages hidden) and the shared libraries
  it links, read-only; /proc and five device nodes (null, zero, full, random, urandom), no /dev/shm, no
  /tmp, no /dev/mqueue. The working directory /work is a tmpfs of memory_mb, the only writable place, so
  its size is the total the program can write; gone when the call ends. Nothing of the host's /etc, /home,
  /root or the job's files is there;
- seccomp (trainer/envs/seccomp.py): sockets, io_uring, ptrace and other processes' memory, namespaces and
  mounts, bpf, perf, keys, userfaultfd, SysV and POSIX IPC, memfd and the host-administration calls fail
  with EPERM; clone3 and calls newer than the table fail with ENOSYS; a foreign ABI kills the process;
- rlimits set by prlimit (util-linux), which then execs bwrap, so every process in the sandbox inherits
  them: RLIMIT_CPU (cpu_seconds), RLIMIT_AS (memory_mb), RLIMIT_FSIZE (memory_mb), RLIMIT_NOFILE,
  RLIMIT_CORE, RLIMIT_MEMLOCK and RLIMIT_MSGQUEUE 0;
- the process cap, per call (issue 44, R5): RLIMIT_NPROC counts a user's tasks in each user namespace
  (Linux 5.14+), checked against the task's own limit in its namespace and against its creator's limit
  in the namespaces above. So bwrap starts with the highest limit this process may set, and inside, in the
  call's own user namespace, prlimit (bound read-only) lowers it to `processes` as pid 1 before it execs
  the interpreter: the count is this call's processes and threads only, whatever runs beside it (before,
  one limit over every task of the user: a call could fork more than its cap, or none at all). RLIMIT_NPROC
  never applies to root, so a root parent runs the sandbox as an unprivileged user (STARE_TOOL_UID,
  default 65534 "nobody");
- one call's CPU budget: the parent sums the CPU time of every process in the sandbox's PID namespace (the
  descendants of its init, sampled every CPU_SAMPLE_S; a reaped child's time is in its parent's) and
  kills the namespace when the sum reaches cpu_seconds; RLIMIT_CPU stays as each process's own backstop;
- the wall clock: after wall_seconds the parent kills the namespace;
- the end of every call, whatever the program did to its parent-death signal or session: bwrap tells the
  parent its init's pid (--info-fd), the parent holds a pidfd of it and SIGKILLs it when the call ends
  (normal exit, CPU budget, wall clock): the kernel then kills every process of the PID namespace, and
  with the last of them go the mount namespace and its /work tmpfs;
- output: stdout and stderr share one pipe; the first output_bytes are kept, the rest is read and dropped.

What it binds for the interpreter is trainer/envs/sandbox_runtime.py's; the parent's hold on the
namespace (its init's pidfd, the CPU budget, the group kill) trainer/envs/sandbox_processes.py's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import threading
import time
from typing import IO

from contract.spec import EnvironmentSpec, ToolLimitsSpec
from trainer.envs.sandbox_processes import CpuBudget, NamespaceInit, with_group
from trainer.envs.sandbox_runtime import Runtime, SandboxUnavailable, python_runtime
from trainer.envs.seccomp import filter_program

BWRAP_ENV = "STARE_BWRAP"  # the bwrap binary (default: bwrap on PATH)
UID_ENV = "STARE_TOOL_UID"  # the user a root parent runs sandboxes as (default 65534)
NOBODY = 65534
SCRATCH = "/work"
DEVICES = ("null", "zero", "full", "random", "urandom")  # /dev inside: nothing writable that stores bytes
OPEN_FILES = 256  # RLIMIT_NOFILE: bounds the pipes and other kernel objects a program can hold
# The environment prlimit and bwrap start with, so also bwrap's own (/proc/<pid>/environ): nothing.
LAUNCH_ENV: dict[str, str] = {}
MIN_BWRAP = (0, 8)  # --disable-userns and --as-pid-1
TRUNCATED_MARK = "\n[output truncated]"
CPU_SAMPLE_S = 0.05  # how often the parent sums the sandbox's CPU time (the budget's overshoot per process)
REAP_S = 5.0  # how long bwrap has to reap its killed init before its own group is killed


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    output: str  # stdout and stderr as they came, cut to output_bytes
    exit_code: int | None  # None: killed by the parent (wall time)
    signal: int | None  # the signal that ended the process, if any
    timed_out: bool  # CPU or wall time
    truncated: bool
    seconds: float
    cpu_seconds: float = 0.0  # the CPU time of the sandbox's processes, as last sampled

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


# ---------------------------------------------------------------------------------------------- command


def bwrap_path() -> str | None:
    """The bwrap executable (STARE_BWRAP, else bwrap on PATH), or None when there is none."""
    return shutil.which(os.environ.get(BWRAP_ENV) or "bwrap")


def _sandbox_uid() -> int | None:
    """The user to run as: a root parent drops to STARE_TOOL_UID (RLIMIT_NPROC does not bind root)."""
    if os.geteuid() != 0:
        return None
    return int(os.environ.get(UID_ENV, NOBODY))


def bwrap_command(
    runtime: Runtime, limits: ToolLimitsSpec, seccomp_fd: int | None, info_fd: int | None = None
) -> list[str]:
    bwrap = bwrap_path()
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed: the python tool cannot run")
    cmd = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--as-pid-1"]
    if info_fd is not None:  # bwrap writes {"child-pid": <the init's pid here>, ...} to it
        cmd += ["--info-fd", str(info_fd)]
    cmd += ["--die-with-parent", "--new-session", "--clearenv"]
    for target, link in runtime.symlinks:
        cmd += ["--symlink", target, link]
    for dest, source in runtime.binds:
        cmd += ["--ro-bind", source, dest]
    for folder in runtime.hidden:
        cmd += ["--tmpfs", folder]
    cmd += ["--proc", "/proc", "--dir", "/dev"]
    for device in DEVICES:
        cmd += ["--dev-bind", f"/dev/{device}", f"/dev/{device}"]
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        cmd += ["--symlink", f"/proc/self/fd/{number}", f"/dev/{name}"]
    cmd += ["--symlink", "/proc/self/fd", "/dev/fd", "--dir", SCRATCH]
    # The sandbox's root is a tmpfs bwrap builds: read-only once the mount points exist; then the scratch
    # tmpfs on top is the one writable place, and its size the total the program can write.
    cmd += ["--remount-ro", "/"]
    cmd += ["--size", str(limits.memory_mb * 2**20), "--tmpfs", SCRATCH, "--chdir", SCRATCH]
    cmd += ["--setenv", "HOME", SCRATCH, "--setenv", "TMPDIR", SCRATCH]
    cmd += ["--setenv", "LD_LIBRARY_PATH", runtime.library_path]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    # prlimit, as pid 1 in the call's user namespace: the process cap counts this call's tasks only. Then
    # -I: isolated (no user site, no PYTHON* variables, no script dir on sys.path); -S: no site module.
    cap = f"--nproc={limits.processes}:{limits.processes}"
    return [*cmd, "--", runtime.launcher, cap, "--", runtime.interpreter, "-I", "-S", "-"]


def _prlimit_prefix(prlimit: str, limits: ToolLimitsSpec) -> tuple[list[str], int]:
    """(the prlimit argv that prefixes bwrap, the CPU seconds it sets) for one call under `limits`. Its
    RLIMIT_NPROC is the highest this process may set: the call's user namespace records it as the limit
    of the namespaces above, where every task of the user counts; the call's own cap is set inside."""
    _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    nproc = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    memory = limits.memory_mb * 2**20
    cpu = max(1, math.ceil(limits.cpu_seconds))
    # prlimit sets the limits on itself, then execs bwrap, so everything in the sandbox inherits them. The
    # user switch and the new session are done by subprocess's C child code (no preexec_fn: the trainer
    # has threads, and Python code between fork and exec could deadlock on a lock one of them held).
    limited = [
        prlimit,
        f"--cpu={cpu}",
        f"--as={memory}",
        f"--fsize={memory}",
        f"--nofile={OPEN_FILES}",
        "--core=0",
        "--memlock=0",
        "--msgqueue=0",
        f"--nproc={nproc}",
        "--",
    ]
    return limited, cpu


def run_python(code: str, limits: ToolLimitsSpec, *, interpreter: str | None = None) -> SandboxResult:
    """Runs `code` (read from stdin) in a fresh sandbox under `limits`. SandboxUnavailable when bwrap or
    the interpreter is missing; any failure of the code itself is a result, never an exception. When it
    returns, no process of the sandbox is left (its PID namespace was killed)."""
    runtime = python_runtime(interpreter)
    start = time.monotonic()
    deadline = start + limits.wall_seconds
    proc, init = launch(runtime, limits, deadline=deadline)
    cpu = max(1, math.ceil(limits.cpu_seconds))  # the RLIMIT_CPU prlimit set
    assert proc.stdin is not None and proc.stdout is not None
    # From a thread: a program longer than the pipe's buffer must not block us while its output fills the
    # other pipe (the wall clock below runs meanwhile).
    feeder = threading.Thread(target=_feed, args=(proc.stdin, code.encode("utf-8", "replace")), daemon=True)
    feeder.start()
    budget = CpuBudget(init, limits.cpu_seconds)
    kept, truncated, killed = _read_output(proc.stdout.fileno(), limits, deadline=deadline, budget=budget)
    if not killed:  # the output ended: the program may still run (it closed its stdout), on the same clocks
        killed = _wait_within(proc, deadline, budget)
    init.kill()  # whatever happened: the PID namespace, and with it every process of the call, ends here
    try:  # bwrap reaps the init (no zombie left to the host's init) and exits
        returncode = proc.wait(timeout=REAP_S)
    except subprocess.TimeoutExpired:
        with_group(proc.pid, signal.SIGKILL)
        returncode = proc.wait()
    init.close()
    proc.stdout.close()
    seconds = time.monotonic() - start
    text = kept.decode("utf-8", "replace")
    if truncated:
        text += TRUNCATED_MARK
    if killed or budget.exceeded:
        return SandboxResult(text, None, signal.SIGKILL, True, truncated, seconds, budget.used)
    sig = -returncode if returncode < 0 else None
    # bwrap reports its child's death by a signal as exit code 128 + signal.
    if sig is None and returncode > 128 and returncode - 128 < 65:
        sig = returncode - 128
    cpu_killed = sig in (signal.SIGXCPU, signal.SIGKILL) and seconds >= min(cpu, 0.5)
    return SandboxResult(
        output=text,
        exit_code=returncode,
        signal=sig,
        timed_out=cpu_killed,
        truncated=truncated,
        seconds=seconds,
        cpu_seconds=budget.used,
    )


def _wait_within(proc: subprocess.Popen[bytes], deadline: float, budget: CpuBudget) -> bool:
    """Waits for bwrap to end under the wall clock and the CPU budget; True when the wall clock ran out."""
    while proc.poll() is None:
        if time.monotonic() >= deadline:
            return True
        if budget.sample():
            return False
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=min(CPU_SAMPLE_S, max(0.0, deadline - time.monotonic())))
    return False


def _feed(pipe: IO[bytes], data: bytes) -> None:
    with contextlib.suppress(OSError):  # the program may exit (or be killed) before reading it all
        pipe.write(data)
        pipe.close()


def _read_output(
    fd: int, limits: ToolLimitsSpec, *, deadline: float, budget: CpuBudget
) -> tuple[bytes, bool, bool]:
    """(the first output_bytes, whether more came, whether the wall clock ran out) of the pipe `fd`; the
    CPU budget is sampled meanwhile (its kill ends the output)."""
    kept = bytearray()
    truncated = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return bytes(kept), truncated, True
        ready, _, _ = select.select([fd], [], [], min(remaining, CPU_SAMPLE_S))
        budget.sample(every=CPU_SAMPLE_S)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return bytes(kept), truncated, False
        room = limits.output_bytes - len(kept)
        truncated = truncated or len(chunk) > room
        kept += chunk[: max(room, 0)]


def available() -> str | None:
    """None when the python tool can run here, else why not (one line): the binaries, the filter's table,
    and one real sandbox started (user namespaces may be off, or a container may refuse them)."""
    try:
        runtime = python_runtime()
        _filter()
    except SandboxUnavailable as err:
        return str(err)
    problem = _missing_binary()
    if problem is not None:
        return problem
    return _probe(bwrap_path() or "", runtime.interpreter, os.geteuid())


def check_python_tool(env: EnvironmentSpec | None) -> None:
    """A job with the python tool (`env`: its spec.environment, None for none) needs the sandbox on this
    machine: without it every call would be a tool error and the run would train on nothing, so it stops
    before it starts (ValueError naming why: exit 2)."""
    if env is None or "python" not in env.tools:
        return
    problem = available()
    if problem is not None:
        raise ValueError(f"environment.tools: the python tool cannot run on this machine: {problem}")


PROBE = "print('sandbox ok')"
PROBE_LIMITS = ToolLimitsSpec(cpu_seconds=5, wall_seconds=20, memory_mb=64, processes=4, output_bytes=4096)


@functools.cache
def _probe(bwrap: str, interpreter: str, euid: int) -> str | None:
    """Runs a one-line program in the sandbox once per (bwrap, interpreter, user); None when it printed."""
    try:
        result = run_python(PROBE, PROBE_LIMITS, interpreter=interpreter)
    except SandboxUnavailable as err:
        return str(err)
    if result.ok and result.output == "sandbox ok\n":
        return None
    last = (result.output.strip().splitlines() or ["no output"])[-1][:200]
    return f"the sandbox does not start here ({bwrap}): {last}"


def _filter() -> bytes:
    try:
        return filter_program()
    except ValueError as err:  # a machine without a reviewed system-call table: never run unfiltered
        raise SandboxUnavailable(str(err)) from None


def _missing_binary() -> str | None:
    bwrap = bwrap_path()
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed: the python tool cannot run"
    if shutil.which("prlimit") is None:
        return "prlimit (util-linux) is not installed: the python tool cannot set its limits"
    version = _bwrap_version(bwrap)
    if version < MIN_BWRAP:
        found = ".".join(map(str, version)) if version else "an unknown version"
        return f"bubblewrap {found} is older than 0.8 (the sandbox needs --disable-userns and --as-pid-1)"
    return None


@functools.cache
def _bwrap_version(bwrap: str) -> tuple[int, ...]:
    """bwrap's version as numbers ("bubblewrap 0.8.0" -> (0, 8, 0)); () when it does not say."""
    try:
        out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out.stdout)
    return tuple(int(part) for part in match.groups() if part is not None) if match else ()


def launch(
    runtime: Runtime,
    limits: ToolLimitsSpec,
    *,
    deadline: float | None = None,
    scratch_mb: int | None = None,
    program: list[str] | None = None,
) -> tuple[subprocess.Popen[bytes], NamespaceInit]:
    """Starts one sandbox (the module docstring's layers) and returns it running, with its init: its
    stdin and stdout are pipes (stderr joins stdout). run_python feeds it a script on stdin; the grader
    pool (trainer/graders/pool.py) talks to its program instead. `program` replaces the script argument
    "-" after the interpreter's -I -S; `scratch_mb` sizes the /work tmpfs (default memory_mb); `deadline`
    bounds the wait for bwrap's word of its init. The caller ends it with init.kill() (the whole PID
    namespace) and reaps the Popen. SandboxUnavailable when bwrap or prlimit is missing or cannot start."""
    problem = _missing_binary()
    if problem is not None:
        raise SandboxUnavailable(problem)
    program_fd, write_fd = os.pipe()
    os.write(write_fd, _filter())  # under 2 KiB: well within the pipe's buffer
    os.close(write_fd)
    info_read, info_write = os.pipe()
    uid = _sandbox_uid()
    limited, _ = _prlimit_prefix(shutil.which("prlimit") or "prlimit", limits)
    scratch = limits if scratch_mb is None else limits.model_copy(update={"memory_mb": max(32, scratch_mb)})
    command = limited + bwrap_command(runtime, scratch, program_fd, info_write)
    if program is not None:
        assert command[-1] == "-", command[-1]
        command = command[:-1] + program
    try:
        # A fixed argv, no shell; cwd "/": not the trainer's run folder.
        proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, env=LAUNCH_ENV, cwd="/", pass_fds=(program_fd, info_write),
            close_fds=True, user=uid, group=uid, extra_groups=[] if uid is not None else None,
        )  # fmt: skip
    except OSError as err:
        os.close(info_read)
        raise SandboxUnavailable(f"cannot start the sandbox: {err}") from None
    finally:
        os.close(program_fd)
        os.close(info_write)
    return proc, NamespaceInit.of(proc, info_read, deadline or time.monotonic() + REAP_S * 6)
