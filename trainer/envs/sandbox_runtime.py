"""What the sandbox binds for the interpreter it runs (trainer/envs/sandbox.py): the binary, its standard
library, the shared libraries it and its extension modules link (found with ldd), and the host's top-level
symlinks. Worked out once per interpreter; the grader pool (trainer/graders/pool.py) adds its environment's
site-packages and libraries to it."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

PYTHON_ENV = "STARE_TOOL_PYTHON"  # the interpreter the tool runs (default: this Python's base interpreter)


class SandboxUnavailable(RuntimeError):
    """bwrap is missing or cannot create its namespaces here: the python tool cannot run."""


def _default_interpreter() -> str:
    """The system's python3 when there is one (readable by the sandbox's user), else this Python's base
    interpreter (never the virtual environment: its site-packages stay out)."""
    major, minor = sys.version_info[:2]
    for candidate in (
        Path("/usr/bin/python3"),
        Path(sys.base_prefix) / "bin" / f"python{major}.{minor}",
        Path(sys.base_prefix) / "bin" / "python3",
    ):
        if candidate.exists():
            return str(candidate.resolve())
    return str(Path(sys.executable).resolve())


_LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


def linked_libraries(binaries: list[str]) -> set[str]:
    libraries: set[str] = set()
    for start in range(0, len(binaries), 64):
        try:
            out = subprocess.run(
                ["ldd", *binaries[start : start + 64]],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        libraries.update(match.group(1) for match in _LDD_LINE.finditer(out))
    return libraries


@dataclasses.dataclass(frozen=True)
class Runtime:
    interpreter: str
    launcher: str  # prlimit, bound too: pid 1 sets the call's process cap, then execs the interpreter
    binds: tuple[tuple[str, str], ...]  # read-only: (path in the sandbox, path on the host)
    hidden: tuple[str, ...]  # directories covered by an empty tmpfs (site-packages)
    symlinks: tuple[tuple[str, str], ...]  # (target, link) as on the host (/lib -> usr/lib)
    library_path: str


def python_runtime(interpreter: str | None = None) -> Runtime:
    """What the sandbox binds for the interpreter: the binary, its standard library, the libraries it and
    its extension modules link (found with ldd; each at the path the loader looks for), and the host's
    top-level symlinks (/lib -> usr/lib). Worked out once per interpreter (ldd takes a few seconds)."""
    return _runtime_of(
        str(Path(interpreter or os.environ.get(PYTHON_ENV) or _default_interpreter()).resolve())
    )


@functools.cache
def _runtime_of(exe: str) -> Runtime:
    try:
        probe = subprocess.run(
            [exe, "-I", "-S", "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SandboxUnavailable(f"the tool interpreter {exe} does not run: {err}") from None
    if probe.returncode != 0:
        raise SandboxUnavailable(f"the tool interpreter {exe} does not run: {probe.stderr.strip()[-200:]}")
    stdlib = str(Path(probe.stdout.strip()).resolve())
    dynload = Path(stdlib) / "lib-dynload"
    modules = sorted(str(p) for p in dynload.glob("*.so")) if dynload.is_dir() else []
    launcher = str(Path(shutil.which("prlimit") or "/usr/bin/prlimit").resolve())
    binds: dict[str, str] = {exe: exe, stdlib: stdlib, launcher: launcher}  # destination -> source
    for lib in linked_libraries([exe, launcher, *modules]):
        dest = str(Path(lib).parent.resolve() / Path(lib).name)
        if not dest.startswith(stdlib + "/"):
            binds[dest] = str(Path(lib).resolve())
    hidden = tuple(
        str(Path(stdlib) / name)
        for name in ("site-packages", "dist-packages")
        if (Path(stdlib) / name).is_dir()
    )
    symlinks = tuple(
        (os.readlink(top), top)
        for top in ("/lib", "/lib64", "/lib32", "/libx32", "/bin")
        if os.path.islink(top)
    )
    libraries = {str(Path(dest).parent) for dest in binds if dest not in (exe, stdlib, launcher)}
    library_path = ":".join(sorted(libraries))
    return Runtime(exe, launcher, tuple(sorted(binds.items())), hidden, symlinks, library_path)
