"""The task-check children's confinement: bubblewrap around the child's interpreter (issue 44, R1).

A task check runs a dependency (reasoning-gym's generator, a verifier) on a tenant's config and completion.
No config field names a file any more (trainer/tasks/rg_config.py), but a field missed there, or a generator that
opens something by a name a tenant steers, must find nothing to read. So the child sees:

- a fresh root (an empty tmpfs, read-only once built) holding only what Python and our code read, each
  bound read-only: `/usr` and the top-level links into it (`/lib`, `/lib64`, `/bin`), the base
  interpreter's prefix, the virtual environment (site-packages: reasoning-gym, its data, sympy, numpy),
  and the three source folders the child imports (`service`, `trainer`, `contract`); a private `/tmp` and
  a minimal `/dev`. No `/etc`, `/home`, `/root`, `/proc`, `/sys`, artifact root or model folder: nothing of
  the host, the API or a tenant. Without `/proc` the child reaches no sysctl, whatever its user id;
- its own user, PID, network (loopback only, down), IPC, UTS and cgroup namespaces, no nested user
  namespace (`--disable-userns`), no capabilities, `--die-with-parent`, `--new-session`;
- the python tool's system-call filter (trainer/envs/seccomp.py): no socket, no keyring (a root API's
  child would otherwise share root's user keyring), no ptrace, mount or namespace call;
- an empty environment but for PYTHONPATH, HOME/TMPDIR/MPLCONFIGDIR (the private /tmp) and one thread
  per math library.

The child talks to the API over one socket passed as a descriptor. Without bwrap (or where it cannot start)
task checks are refused (503) unless the operator turns this off: STARE_TASK_CHECK_ISOLATION=false.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

TOP_LINKS = ("/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
SOURCE_PACKAGES = ("service", "trainer", "contract")
CHILD_ENV = {
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "MPLCONFIGDIR": "/tmp",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def bwrap_path() -> str | None:
    return shutil.which(os.environ.get("STARE_BWRAP") or "bwrap")


def _source_roots() -> list[Path]:
    """The folders holding our packages (a source checkout's root, or site-packages): PYTHONPATH inside."""
    roots = []
    for name in SOURCE_PACKAGES:
        module = sys.modules.get(name) or __import__(name)
        roots.append(Path(module.__file__ or "").resolve().parent.parent)
    return list(dict.fromkeys(roots))


def _binds() -> list[tuple[str, str]]:
    """(host path, path inside) of everything bound read-only, in order."""
    binds = [("/usr", "/usr")]
    prefixes = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    for prefix in sorted(prefixes):
        if not str(prefix).startswith("/usr/"):
            binds.append((str(prefix), str(prefix)))
    if Path(sys.prefix) != Path(sys.prefix).resolve():  # a virtual environment reached through a link
        binds.append((str(Path(sys.prefix).resolve()), sys.prefix))
    for root in _source_roots():
        for name in SOURCE_PACKAGES:
            folder = root / name
            if folder.is_dir() and not any(str(folder).startswith(p + "/") for p, _ in binds[1:]):
                binds.append((str(folder), str(folder)))
    return binds


def confined_argv(python_argv: list[str], seccomp_fd: int) -> list[str]:
    """`python_argv` under bwrap as the module's docstring says; `seccomp_fd` holds the filter program."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise OSError("bubblewrap (bwrap) is not installed")
    cmd = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
    cmd += ["--new-session", "--as-pid-1", "--cap-drop", "ALL", "--clearenv"]
    cmd += ["--tmpfs", "/", "--dir", "/tmp", "--dev", "/dev"]
    for link in TOP_LINKS:
        if os.path.islink(link):
            cmd += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link) and not link.startswith("/usr"):
            cmd += ["--ro-bind", link, link]
    for source, dest in _binds():
        cmd += ["--ro-bind", source, dest]
    roots = os.pathsep.join(str(root) for root in _source_roots())
    cmd += ["--setenv", "PYTHONPATH", roots]
    for name, value in CHILD_ENV.items():
        cmd += ["--setenv", name, value]
    cmd += ["--chdir", "/", "--remount-ro", "/", "--tmpfs", "/tmp", "--seccomp", str(seccomp_fd)]
    return [*cmd, "--", *python_argv]


def seccomp_program() -> bytes:
    from trainer.envs.seccomp import filter_program

    return filter_program()


@functools.cache
def confinement_problem() -> str | None:
    """None when a confined child can start here, else why not (one line). Probed once per process."""
    if bwrap_path() is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        program = seccomp_program()
    except ValueError as err:
        return str(err)
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, program)
        os.close(write_fd)
        write_fd = -1
        argv = confined_argv([sys.executable, "-I", "-c", "pass"], read_fd)
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=60, pass_fds=(read_fd,), check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bubblewrap does not start here: {err}"
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    if done.returncode != 0:
        return f"bubblewrap does not start here: {done.stderr.strip()[-300:]}"
    return None
