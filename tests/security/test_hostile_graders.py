"""The hostile-grader suite: every program of tests/security/grader_programs.py as a tenant's python grader
in its own sandboxed pool (one process). For each: the sample before ("ping") grades 0.5; the attack
escapes nothing (a score of 1.0 would say it read the planted secret, reached the network or saw the
host), ends within its budget (timeout_s, plus the time to kill the process), and comes back as 0.0 or as
a grader error; the sample after grades 0.5 again (the process it left, or a fresh one). Beside it, a
bystander pool (another job) grades throughout, the planted files are unchanged, and when a pool closes no
process of it is left on the host."""

from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.graders import GraderLimitsSpec, parse_grader
from tests.graders.conftest import grader_environment  # noqa: F401 - the fixture
from tests.security.grader_programs import HOSTILE
from trainer.graders.grading import Grader, Outcome

LIMITS = GraderLimitsSpec(timeout_s=2.0, memory_mb=512, disk_mb=64, processes=16, output_bytes=4096)
KILL_SLACK_S = 1.5  # past the budget: killing the namespace and reading the end of the pipe
PLANT_VALUE = "plant-4c1d9e0b7f"
ESCAPED = 1.0
ITEM = {"prompt": "2+2=", "answer": "4"}
TEMPLATE = """import builtins, ctypes, os, signal, socket, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)

def attack():
{body}

def grade(sample, item):
    if sample["output_text"] == "attack":
        return attack()
    return 0.5
"""


def test_the_suite_holds_at_least_sixty_programs() -> None:
    assert len(HOSTILE) >= 60


@pytest.fixture(scope="module")
def plant(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Another job's folder on the host with a secret in it, and the secret in this process's environment."""
    folder = tmp_path_factory.mktemp("other-tenant") / "job_planted"
    folder.mkdir()
    (folder / "secret.txt").write_text(PLANT_VALUE)
    folder.chmod(0o755)
    (folder / "secret.txt").chmod(0o644)  # readable by anyone on the host: only the sandbox keeps it out
    os.environ["STARE_PLANT"] = PLANT_VALUE
    yield folder / "secret.txt"
    os.environ.pop("STARE_PLANT", None)


@pytest.fixture(scope="module")
def bystander(grader_environment: None) -> Iterator[Grader]:  # noqa: F811
    """Another job's pool, grading while the hostile ones run."""
    grader = Grader.start(
        parse_grader({"type": "python", "source": TEMPLATE.format(body="    return 0.0")}), LIMITS, 1
    )
    yield grader
    grader.close()


def _harness_processes() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                command = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"/grader/harness.py" in command:
                found.append(int(entry))
    return found


def _grade(grader: Grader, text: str) -> Outcome:
    return grader.grade([text], [ITEM])[0]


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_grader_escapes_nothing_and_ends_within_its_budget(
    name: str, plant: Path, bystander: Grader
) -> None:
    body = HOSTILE[name].replace("PLANT_FILE", str(plant)).replace("PLANT_DIR", str(plant.parent))
    body = body.replace("PLANT_VALUE", PLANT_VALUE)
    source = TEMPLATE.format(body=textwrap.indent(body, "    "))
    before_processes = set(_harness_processes())
    grader = Grader.start(parse_grader({"type": "python", "source": source}), LIMITS, 1)
    try:
        before = _grade(grader, "ping")
        start = time.monotonic()
        attack = _grade(grader, "attack")
        took = time.monotonic() - start
        after = _grade(grader, "ping")
    finally:
        grader.close()
    assert before.score == 0.5, before
    assert attack.score != ESCAPED, (name, attack)
    assert attack.score == 0.0 or not attack.ok, (name, attack)
    assert took <= LIMITS.timeout_s + KILL_SLACK_S, (name, took, attack)
    assert after.score == 0.5, (name, after)
    assert _grade(bystander, "ping").score == 0.5  # the other job's pool grades on
    assert plant.read_text() == PLANT_VALUE
    assert not _leftover(before_processes | set(_bystander_pids(bystander))), name


def _leftover(known: set[int]) -> set[int]:
    """The grader processes on the host beside `known`, once the kernel has finished the SIGKILLed ones
    (their exit can take a moment after the namespace's init is reaped)."""
    deadline = time.monotonic() + 5.0
    while True:
        leftover = set(_harness_processes()) - known
        if not leftover or time.monotonic() > deadline:
            return leftover
        time.sleep(0.1)


def _bystander_pids(grader: Grader) -> list[int]:
    assert grader.pool is not None
    return [pid for pid in _harness_processes() if _belongs(pid, grader)]


def _belongs(pid: int, grader: Grader) -> bool:
    assert grader.pool is not None
    roots = {slot.init.pid for slot in grader.pool._slots if slot.init is not None}
    roots |= {slot.proc.pid for slot in grader.pool._slots if slot.proc is not None}  # bwrap above it
    seen = pid
    for _ in range(64):  # walk up to the pool's sandbox init (or bwrap above it)
        if seen in roots:
            return True
        try:
            stat = Path(f"/proc/{seen}/stat").read_text()
        except OSError:
            return False
        seen = int(stat[stat.rfind(")") + 2 :].split()[1])
        if seen <= 1:
            return False
    return False
