"""tests/machine_lock.py: ordinary tests share the machine, a solo test holds it alone, and a waiting solo
test is not starved by ordinary tests that arrive after it."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.machine_lock import hold_machine


def _run(run_id: str, name: str, alone: bool, hold_s: float, log: list[tuple[str, str]]) -> threading.Thread:
    def body() -> None:
        with hold_machine(run_id, alone=alone):
            log.append(("start", name))
            time.sleep(hold_s)
            log.append(("end", name))

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def test_two_ordinary_tests_overlap() -> None:
    run_id, log = uuid.uuid4().hex, []
    threads = [_run(run_id, "a", False, 0.3, log), _run(run_id, "b", False, 0.3, log)]
    for t in threads:
        t.join(5)
    assert [event for event, _ in log] == ["start", "start", "end", "end"], log


def test_a_solo_test_waits_for_the_running_one_and_the_next_one_waits_for_it() -> None:
    run_id, log = uuid.uuid4().hex, []
    first = _run(run_id, "ordinary-1", False, 0.5, log)
    time.sleep(0.1)
    solo = _run(run_id, "solo", True, 0.3, log)
    time.sleep(0.1)
    later = _run(run_id, "ordinary-2", False, 0.1, log)  # arrives while the solo test waits
    for t in (first, solo, later):
        t.join(5)
    assert log == [
        ("start", "ordinary-1"),
        ("end", "ordinary-1"),
        ("start", "solo"),
        ("end", "solo"),
        ("start", "ordinary-2"),
        ("end", "ordinary-2"),
    ], log


def test_the_longest_first_modules_exist_and_come_first_in_their_order() -> None:
    from pathlib import Path

    from tests.machine_lock import LONGEST_FIRST, scheduling_rank

    root = Path(__file__).resolve().parents[1]
    assert all((root / module).is_file() for module in LONGEST_FIRST)  # a renamed module is noticed
    ranks = [scheduling_rank(m) for m in (*LONGEST_FIRST, "tests/test_machine_lock.py")]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)


def test_the_timeline_has_one_line_per_test_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.machine_lock import record_timeline

    path = tmp_path / "timeline.tsv"
    monkeypatch.delenv("STARE_TEST_TIMELINE", raising=False)
    record_timeline("t.py::a", alone=False, queued=1.0, started=2.0, ended=3.0)
    assert not path.exists()
    monkeypatch.setenv("STARE_TEST_TIMELINE", str(path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    record_timeline("t.py::a", alone=False, queued=1.0, started=2.0, ended=3.0)
    record_timeline("t.py::b", alone=True, queued=3.0, started=5.5, ended=9.25)
    rows = [line.split("\t") for line in path.read_text().splitlines()]
    assert rows == [
        ["gw1", "0", "1.000", "2.000", "3.000", "t.py::a"],
        ["gw1", "1", "3.000", "5.500", "9.250", "t.py::b"],
    ]
