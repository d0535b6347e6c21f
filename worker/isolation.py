"""The trainer's confinement: bubblewrap (bwrap) around the trainer child, so it sees only its own job.

The trainer runs tenant-chosen specs over tenant data and model output; whatever runs in it (a dependency
that evaluates a string, a hostile model's completion) must find nothing of the worker, the API or other
tenants. docs/SECURITY.md ("The trainer's confinement") states the boundary; in short, the child is
`bwrap ... -- <the trainer command>` with:

- its own PID namespace and a fresh /proc (`--unshare-pid --as-pid-1`): the worker's and the API's
  processes, their /proc/<pid>/environ and memory do not exist inside; the trainer (or torchrun) is the
  namespace's init, so a SIGKILL to it ends every process of the job. Also its own IPC and UTS namespaces;
- the file system: the host's root read-only, with a fresh /dev (no host /dev/shm: a private one; the
  GPU device nodes bound in), and empty tmpfs over the artifact root, /tmp, /var/tmp, /run and the
  worker's home; then bound back: this job's run folder (read-write), its uploaded task file (read-only),
  the model cache (read-write: the first load of a built-in model converts it there), the Hugging Face
  cache (read-only), and read-only what the interpreter needs when it lives under a hidden place (the
  virtual environment's base interpreter, the PYTHONPATH entries, the working directory); the artifact
  root's tmpfs last, so that no bind above brings it back. HOME is a private folder under the private /tmp;
- the network: a one-node job (one process, or torchrun's processes on this node) gets its own network
  namespace with only loopback (torchrun's rendezvous and the collectives run over lo: GLOO_SOCKET_IFNAME
  and NCCL_SOCKET_IFNAME say so); a Ray driver keeps the host's network, Ray's temporary folder (its
  sockets) and the host's PID namespace (Ray tells a node's drivers apart by pid: two drivers in their own
  namespaces would both be pid 1): the cluster is on the network, and its processes run on the Ray nodes,
  outside this sandbox;
- `--die-with-parent`, `--new-session` (the trainer leads its own process group: the supervisor's SIGTERM
  reaches the trainer and torchrun's processes, never bwrap's monitor), `--cap-drop ALL`;
- its user: the worker's, when the worker is not root (as the images run it; bwrap then makes an
  unprivileged user namespace). Under a root worker (issue 44, R2: kernel settings in /proc/sys check the
  uid, not capabilities, so a trainer left root without a capability could still rewrite
  kernel.core_pattern) bwrap sets up the namespaces as root and hands over to setpriv, which switches to
  `Confinement.run_as` (STARE_TRAINER_UID, 65534), clears the groups, the capabilities and the bounding
  set and sets no_new_privs before the trainer starts: no file of uid 0 is writable to it and no
  root-only file readable. The worker gives the run folder and the model cache to that uid first
  (`prepare`). The python tool's nested sandbox still needs a worker that is not root (bwrap, as root,
  covers parts of the trainer's /proc, and the kernel then refuses a nested /proc mount);
- a private keyring: a system-call filter (`keyring_filter`, --seccomp) refuses keyctl, add_key and
  request_key (EPERM), so no key crosses from a trainer to another job's or to the host's processes of the
  same uid (R6); calls through a foreign ABI are refused too;
- bwrap's --info-fd: the supervisor learns the init's pid and signals it directly.

Without bwrap the worker refuses to run jobs (worker/__main__.py) unless the operator turns the
confinement off: STARE_TRAINER_ISOLATION=false.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import glob
import json
import os
import re
import select
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

MIN_BWRAP = (0, 8)  # --as-pid-1
BWRAP_ENV = "STARE_BWRAP"
# The trainer's model cache (trainer/models.py, which the worker does not import): STARE_MODEL_CACHE, else
DEFAULT_MODEL_CACHE = "~/.cache/stare-rl/models"
DEFAULT_HF_HOME = "~/.cache/huggingface"
# Places of the host hidden under an empty tmpfs (besides the artifact root and the worker's home).
HIDDEN = ("/tmp", "/var/tmp", "/run")
PRIVATE_HOME = "/tmp/home"
# Device nodes of accelerators, bound into the fresh /dev when the host has them.
DEVICE_GLOBS = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri", "/dev/kfd", "/dev/infiniband")
RAY_TMP = "/tmp/ray"  # Ray's default temporary folder: its session's sockets, for a Ray driver
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
INFO_WAIT_S = 30.0
DEFAULT_TRAINER_UID = 65534  # "nobody": the uid a root worker's trainers run as (STARE_TRAINER_UID)
# What setpriv keeps to switch a root worker's trainer to its uid, dropped again before the trainer starts.
SWITCH_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")


@dataclasses.dataclass(frozen=True)
class Confinement:
    """What one trainer may see: its run folder (read-write) and the rest named here."""

    artifact_root: Path
    job_dir: Path
    read_only: tuple[Path, ...] = ()  # the uploaded task file
    network: bool = False  # the host's network (a Ray driver); else loopback only
    # Its own PID namespace and /proc. Not for a Ray driver: Ray tells the drivers of one node apart by pid,
    # and two drivers in namespaces of their own are both pid 1 (the second never connects, measured).
    own_pids: bool = True
    # The uid (and gid) the trainer switches to inside, for bwrap started by a root worker; None: bwrap's.
    run_as: int | None = None


def trainer_uid(env: Mapping[str, str]) -> int | None:
    """The uid a root worker runs its trainers as (STARE_TRAINER_UID, default 65534); None for a worker that
    is not root (its trainers are its own user)."""
    if os.geteuid() != 0:
        return None
    return int(env.get("STARE_TRAINER_UID") or DEFAULT_TRAINER_UID)


def bwrap_path() -> str | None:
    return shutil.which(os.environ.get(BWRAP_ENV) or "bwrap")


def model_cache(env: Mapping[str, str]) -> Path:
    return Path(env.get("STARE_MODEL_CACHE") or DEFAULT_MODEL_CACHE).expanduser().resolve()


def _under(path: Path, folders: list[Path]) -> bool:
    return any(path == folder or folder in path.parents for folder in folders)


def _interpreter_folders(python: str, env: Mapping[str, str]) -> list[Path]:
    """What the trainer's interpreter reads: its prefix, a virtual environment's base interpreter
    (pyvenv.cfg's home), and the PYTHONPATH entries."""
    exe = Path(python)
    folders = [exe.parent.parent, exe.resolve().parent.parent]
    cfg = exe.parent.parent / "pyvenv.cfg"
    if cfg.is_file():
        match = re.search(r"^home\s*=\s*(.+)$", cfg.read_text(errors="replace"), re.MULTILINE)
        if match:
            folders.append(Path(match.group(1).strip()).parent)
    folders += [Path(entry) for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return [folder.resolve() for folder in folders if folder.exists()]


def confined_command(
    command: list[str],
    confinement: Confinement,
    env: Mapping[str, str],
    info_fd: int,
    seccomp_fd: int | None = None,
) -> list[str]:
    """`command` under bwrap as the module's docstring describes. `env` is the trainer's environment (its
    PYTHONPATH and model cache say what to bind back); `seccomp_fd` holds `keyring_filter()`."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise OSError("bubblewrap (bwrap) is not installed: the trainer cannot be confined")
    cmd = [bwrap, *_namespaces(confinement, info_fd), *_file_system(command, confinement, env)]
    cmd += ["--setenv", "HOME", PRIVATE_HOME, "--setenv", "TMPDIR", "/tmp"]
    if not confinement.network:
        for name, value in LOOPBACK_ENV.items():
            cmd += ["--setenv", name, value]
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    if confinement.run_as is not None:
        command = [*_setpriv(confinement.run_as), *command]
    return [*cmd, "--", *command]


def _namespaces(confinement: Confinement, info_fd: int) -> list[str]:
    cmd = ["--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if confinement.own_pids:
        cmd += ["--unshare-pid", "--as-pid-1"]
    if not confinement.network:
        cmd.append("--unshare-net")
    cmd += ["--die-with-parent", "--new-session", "--info-fd", str(info_fd)]
    cmd += ["--cap-drop", "ALL"]  # (as root: bwrap would otherwise leave the child every capability)
    if confinement.run_as is not None:  # what setpriv needs, and drops before the trainer starts
        for cap in SWITCH_CAPS:
            cmd += ["--cap-add", cap]
    return cmd


def _file_system(command: list[str], confinement: Confinement, env: Mapping[str, str]) -> list[str]:
    cmd = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    # The private /dev/shm open to every user like the host's (1777): a root worker's trainer runs as
    # STARE_TRAINER_UID, and POSIX semaphores and shared memory (vLLM's engine lock) are files there.
    cmd += ["--perms", "1777", "--tmpfs", "/dev/shm"]
    for device in sorted({path for pattern in DEVICE_GLOBS for path in glob.glob(pattern)}):
        cmd += ["--dev-bind", device, device]
    home = Path(os.environ.get("HOME") or "/").resolve()
    hidden = [Path(place) for place in HIDDEN if Path(place).is_dir()]
    if home != Path("/") and home.is_dir():
        hidden.append(home)
    for place in hidden:
        cmd += ["--perms", "1777" if str(place).endswith("tmp") else "0755", "--tmpfs", str(place)]
    cmd += ["--perms", "0700" if confinement.run_as is None else "0777", "--dir", PRIVATE_HOME]
    # Bound back over the hidden places (bwrap applies its arguments in order): what the interpreter reads.
    cwd = Path.cwd().resolve()
    for folder in dict.fromkeys([*_interpreter_folders(command[0], env), cwd]):
        if _under(folder, hidden):
            cmd += [*_open_parents(folder, hidden), "--ro-bind", str(folder), str(folder)]
    if confinement.network and Path(RAY_TMP).is_dir():
        cmd += ["--bind", RAY_TMP, RAY_TMP]
    cache = model_cache(env)
    cache.mkdir(parents=True, exist_ok=True)
    cmd += [*_open_parents(cache, hidden), "--bind", str(cache), str(cache)]
    cmd += ["--setenv", "STARE_MODEL_CACHE", str(cache)]
    hub = Path(env.get("HF_HOME") or DEFAULT_HF_HOME).expanduser().resolve()
    if hub.is_dir():  # models fetched beforehand (the machines have no hub): read, never written, here
        cmd += [*_open_parents(hub, hidden), "--ro-bind", str(hub), str(hub), "--setenv", "HF_HOME", str(hub)]
    # Last, so that nothing bound above brings it back: the artifact root, empty, then this job's files.
    root = confinement.artifact_root.resolve()
    cmd += ["--perms", "0755", "--tmpfs", str(root)]
    for path in confinement.read_only:
        if path.exists():
            cmd += [
                *_open_parents(path.resolve(), [root]),
                "--ro-bind",
                str(path.resolve()),
                str(path.resolve()),
            ]
    job_dir = confinement.job_dir.resolve()
    cmd += [*_open_parents(job_dir, [root]), "--bind", str(job_dir), str(job_dir), "--chdir", str(cwd)]
    return cmd


def _open_parents(folder: Path, hidden: list[Path]) -> list[str]:
    """`--perms 0755 --dir` for each folder between the hidden place above `folder` and it: bwrap would make
    them 0700 (only the worker's user could pass them, not a trainer switched to another uid)."""
    top = next((place for place in hidden if place == folder or place in folder.parents), None)
    if top is None:
        return []
    between = [parent for parent in reversed(folder.parents) if top in parent.parents]
    return [arg for parent in between for arg in ("--perms", "0755", "--dir", str(parent))]


def _setpriv(uid: int) -> list[str]:
    setpriv = shutil.which("setpriv") or "setpriv"
    return [
        setpriv,
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def prepare(confinement: Confinement, env: Mapping[str, str]) -> None:
    """Give the run folder and the model cache to the uid a root worker's trainer runs as (whatever in them
    is not its already): it writes both. Nothing to do when the trainer runs as the worker's user."""
    uid = confinement.run_as
    if uid is None:
        return
    for top in (confinement.job_dir, model_cache(env)):
        top.mkdir(parents=True, exist_ok=True)
        for folder, dirs, files in os.walk(top):
            for name in [folder, *(os.path.join(folder, entry) for entry in dirs + files)]:
                if os.lstat(name).st_uid != uid:
                    os.lchown(name, uid, uid)


# --- the keyring filter -------------------------------------------------------------------------------------

# (AUDIT_ARCH_* of the native ABI, the x32 bit or 0, {keyctl, add_key, request_key}) per machine.
_KEYRING_CALLS = {
    "x86_64": (0xC000003E, 0x40000000, (250, 248, 249)),
    "aarch64": (0xC00000B7, 0, (219, 217, 218)),
}
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _EPERM = 0x7FFF0000, 0x00050000 | errno.EPERM


def keyring_filter(machine: str | None = None) -> bytes:
    """A classic-BPF seccomp program: keyctl, add_key and request_key fail with EPERM, as does every call
    through a foreign ABI (i386, x32: their numbers differ); everything else is allowed. ValueError on a
    machine without a table (the worker then cannot confine its trainers)."""
    machine = machine or os.uname().machine
    if machine not in _KEYRING_CALLS:
        raise ValueError(
            f"no system-call table for {machine} (the trainer's keyring filter knows x86_64, aarch64)"
        )
    arch, foreign_bit, calls = _KEYRING_CALLS[machine]
    program = [(_LD, 0, 0, 4), (_JEQ, 1, 0, arch), (_RET, 0, 0, _EPERM), (_LD, 0, 0, 0)]
    if foreign_bit:
        program += [(_JGE, 0, 1, foreign_bit), (_RET, 0, 0, _EPERM)]
    for number in calls:
        program += [(_JEQ, 0, 1, number), (_RET, 0, 0, _EPERM)]
    program.append((_RET, 0, 0, _ALLOW))
    return b"".join(struct.pack("=HBBI", *insn) for insn in program)


def filter_fd() -> int:
    """A pipe's read end holding keyring_filter() (under 1 KiB: it fits the pipe), for bwrap's --seccomp."""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, keyring_filter())
    finally:
        os.close(write_fd)
    return read_fd


def read_child_pid(fd: int, timeout: float = INFO_WAIT_S) -> int | None:
    """The init's pid from bwrap's --info-fd JSON; None when bwrap closed it without one (it failed)."""
    data, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        try:
            info = json.loads(data)
        except ValueError:
            continue
        pid = info.get("child-pid") if isinstance(info, dict) else None
        return pid if isinstance(pid, int) and pid > 0 else None
    return None


def isolation_problem() -> str | None:
    """None when trainers can be confined here, else why not (one line): bwrap there, recent enough, and
    one confined process started."""
    bwrap = bwrap_path()
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    return _probe(bwrap)


@functools.cache
def _probe(bwrap: str) -> str | None:
    version = _bwrap_version(bwrap)
    if version < MIN_BWRAP:
        return f"bubblewrap {'.'.join(map(str, version)) or '(unknown version)'} is older than 0.8"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed: a root worker cannot switch its trainers to their uid"
    read_fd, write_fd = os.pipe()
    seccomp = -1
    try:
        seccomp = filter_fd()
        with tempfile.TemporaryDirectory(prefix="stare-confinement-") as folder:
            os.chmod(folder, 0o755)
            probe = Confinement(
                Path(folder) / "artifacts", Path(folder) / "artifacts" / "job", run_as=trainer_uid(os.environ)
            )
            probe.job_dir.mkdir(parents=True)
            env = {**os.environ, "STARE_MODEL_CACHE": str(Path(folder) / "cache")}
            prepare(probe, env)
            cmd = confined_command(["/bin/sh", "-c", "exit 0"], probe, env, write_fd, seccomp)
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=60, pass_fds=(write_fd, seccomp), check=False
            )
    except (OSError, ValueError, subprocess.TimeoutExpired) as err:
        return f"bubblewrap does not start here: {err}"
    finally:
        for fd in (read_fd, write_fd, seccomp):
            if fd >= 0:
                os.close(fd)
    if done.returncode != 0:
        return f"bubblewrap does not start here: {done.stderr.strip()[-300:]}"
    return None


@functools.cache
def _bwrap_version(bwrap: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out.stdout)
    return tuple(int(part) for part in match.groups() if part is not None) if match else ()
