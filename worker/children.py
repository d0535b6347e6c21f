"""The embedded launcher's processes, watched: what it checks before it starts any, and what it says when
one of them ends on its own.

`confinement_problem()` is the check before anything starts: the worker refuses to run jobs when it cannot
confine a trainer (worker/isolation.py), so a launcher that started it anyway would submit a job that no
worker ever takes. It answers one line naming the package and the command that installs it.

`Child` is one started process (the API or the worker) with its log file. `raise_if_exited(children)` is
called by every waiting loop of the launcher (the API's start, the job's progress, `--serve`'s idle loop):
a child that has exited raises `ChildExited`, whose `report()` names the process, how it ended, its reason
(the last error line of its log) and its last log lines. `stop(children, grace_s)` ends the others.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from worker.settings import WorkerSettings

TAIL_LINES = 15
INSTALL_COMMAND = "scripts/install-system-deps bubblewrap"  # or `sudo apt-get install bubblewrap`
# A line that says why a process ended: a logged error, an exception's last line, a refusal.
_REASON = re.compile(r"\b(ERROR|CRITICAL|FATAL)\b|^\w+(\.\w+)*(Error|Exception)\b|refusing", re.IGNORECASE)


def confinement_problem() -> str | None:
    """None when the worker will run jobs here, else one line saying why not and what to do."""
    if not WorkerSettings().trainer_isolation:
        return None
    from worker.isolation import isolation_problem

    problem = isolation_problem()
    if problem is None:
        return None
    if "not installed" in problem:
        return (
            "bubblewrap (bwrap) is not installed, and the worker confines every trainer with it: install "
            f"the Debian package bubblewrap (`{INSTALL_COMMAND}`, or `sudo apt-get install bubblewrap`), "
            "or set STARE_TRAINER_ISOLATION=false where the host is isolated otherwise (docs/SECURITY.md)"
        )
    return (
        f"the worker cannot confine a trainer here ({problem}): it would refuse every job. Fix bubblewrap, "
        "or set STARE_TRAINER_ISOLATION=false where the host is isolated otherwise (docs/SECURITY.md)"
    )


@dataclasses.dataclass
class Child:
    name: str  # "API", "worker"
    proc: subprocess.Popen[bytes]
    log: Path


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def last_lines(log: Path, count: int = TAIL_LINES) -> list[str]:
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-count:]


def reason_of(lines: Sequence[str]) -> str | None:
    """The last line of the log tail that says why (an error, an exception, a refusal), else None."""
    return next((line.strip() for line in reversed(lines) if _REASON.search(line.strip())), None)


class ChildExited(RuntimeError):
    """A process the launcher started has exited while the launcher still needed it."""

    def __init__(self, child: Child) -> None:
        self.child = child
        code = child.proc.returncode
        self.how = how_it_ended(code if code is not None else 0)
        self.lines = last_lines(child.log)
        self.reason = reason_of(self.lines)
        super().__init__(f"the {child.name} exited ({self.how})")

    def report(self) -> str:
        """What the user reads: which process, how it ended, why, and its last log lines."""
        out = [f"stopped: the {self.child.name} exited ({self.how})."]
        if self.reason:
            out.append(f"reason: {self.reason}")
        out.append(f"last lines of {self.child.log}:")
        out += [f"  {line}" for line in self.lines] or ["  (empty)"]
        return "\n".join(out)


def exited(children: Sequence[Child]) -> Child | None:
    return next((child for child in children if child.proc.poll() is not None), None)


def raise_if_exited(children: Sequence[Child]) -> None:
    child = exited(children)
    if child is not None:
        raise ChildExited(child)


def stop(children: Sequence[Child], grace_s: float) -> None:
    """SIGTERM to each child still running; SIGKILL to those still there after `grace_s`."""
    for child in children:
        if child.proc.poll() is None:
            child.proc.terminate()
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
