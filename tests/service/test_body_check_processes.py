"""service/body_checks.py: the processes that check large JSON bodies end with the API process, however it
ends (here a SIGKILL, where no shutdown code runs); before, they waited on their queue forever."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

API = textwrap.dedent(
    """
    import asyncio, os, signal
    from service.body_checks import INLINE_BYTES, BodyChecks

    checks = BodyChecks(processes=2, max_values=10**7)
    body = b"[" + b"0," * INLINE_BYTES + b"0]"  # over INLINE_BYTES: checked in a pool process
    assert asyncio.run(checks.check(body)) is None
    print(" ".join(str(pid) for pid in checks._pool._processes), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_the_checking_processes_end_with_a_killed_api(tmp_path: Path) -> None:
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:  # files: a surviving child would hold a pipe open
        done = subprocess.run(
            [sys.executable, "-c", API], cwd=ROOT, stdout=stdout, stderr=stderr, timeout=120
        )
    assert done.returncode == -9, err.read_text()
    pids = [int(p) for p in out.read_text().split()]
    assert len(pids) >= 1, out.read_text()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids if _alive(pid)]
    for pid in left:  # never leave them behind, even when the test fails
        subprocess.run(["kill", "-9", str(pid)], check=False)
    assert left == [], f"checking processes outlived the API: {left}"
