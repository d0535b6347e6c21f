"""The trainer's exit code through torchrun, which itself exits 1 whenever one of its processes fails.

- The trainer's exit report (contract.protocol.exit_report) is what torch's own agent parses: torch's
  ProcessFailure reads it from a process's error file, and torch's ErrorHandler copies it into the
  launcher's error file with the process's exit code, where read_exit_report finds code and reason.
- The supervisor maps torchrun's 1 to that code, and only that 1 (a crash, a signal, success stay).
- Real torchrun, 2 processes: a job whose task parameters the trainer refuses ends with 2 (not 1) and the
  trainer's reason; an injected crash stays 1, with the trainer's traceback as the reason (torchrun's own
  stderr ends with its failure summary); a cooperative stop (SIGTERM to the process group) reaches
  torchrun too, which records its own SIGTERM: no code comes back, the worker honours the stop it asked
  for (worker/training.py), and every process wrote its checkpoint and the `interrupted` event first.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from contract.protocol import ERROR_FILE_ENV, ExitCode, ExitReport, exit_report, read_exit_report
from tests.trainer.test_engine import small_spec
from worker.supervisor import TrainerProcess, launched_exit_code, runs_torchrun, trainer_command

ROOT = Path(__file__).resolve().parents[2]
REFUSED = "arithmetic min_operand 5 exceeds max_operand 1"
CRASH = "injected crash at step 1 (STARE_INJECT_CRASH_STEP)"


def test_torch_parses_the_trainers_report_and_copies_it_with_the_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, ProcessFailure

    child, launcher = tmp_path / "child.json", tmp_path / "launcher.json"
    child.write_text(exit_report("error: bad task", "Traceback ...\nValueError: bad task\n"))
    failure = ProcessFailure(local_rank=1, pid=123, exitcode=2, error_file=str(child))
    assert failure.message["message"] == "error: bad task"  # torch read it as a recorded error
    monkeypatch.setenv(ERROR_FILE_ENV, str(launcher))
    ErrorHandler().dump_error_file(failure.error_file, failure.exitcode)  # what torchrun's @record does
    report = read_exit_report(launcher.read_text())
    assert report == ExitReport(2, "error: bad task", "Traceback ...\nValueError: bad task\n")
    assert report.text.endswith("ValueError: bad task")
    # Without a traceback the message is the reason (torchrun's summary prints it in the traceback's place).
    plain = json.loads(exit_report("non-finite loss at step 3"))
    plain["message"]["errorCode"] = 3
    assert read_exit_report(json.dumps(plain)) == ExitReport(3, *["non-finite loss at step 3"] * 2)
    # The child's own file carries no code; torchrun's record of its own failure neither.
    assert read_exit_report(child.read_text()) is None
    own = {"message": {"message": "SignalException: got signal: 15", "extraInfo": {"timestamp": "1"}}}
    assert read_exit_report(json.dumps(own)) is None
    assert read_exit_report("not json") is None and read_exit_report("[]") is None


def test_only_torchruns_one_is_mapped_to_the_reported_code() -> None:
    refused = ExitReport(ExitCode.USER_ERROR, "error: x")
    assert launched_exit_code(ExitCode.FAILED, refused) == ExitCode.USER_ERROR
    assert launched_exit_code(ExitCode.FAILED, ExitReport(ExitCode.INTERRUPTED, "")) == ExitCode.INTERRUPTED
    assert launched_exit_code(ExitCode.FAILED, None) == ExitCode.FAILED
    assert launched_exit_code(ExitCode.OK, refused) == ExitCode.OK
    assert launched_exit_code(-9, refused) == -9  # torchrun itself was killed
    assert launched_exit_code(ExitCode.FAILED, ExitReport(-15, "")) == ExitCode.FAILED  # a signal: no code
    one = trainer_command("/py", Path("s"), Path("o"), resume=False, num_processes=1)
    two = trainer_command("/py", Path("s"), Path("o"), resume=False, num_processes=2, stop_grace_s=59.5)
    assert not runs_torchrun(one) and runs_torchrun(two)
    assert two[two.index("--shutdown-timeout") + 1] == "60"  # torchrun waits the worker's stop grace


def _launch(tmp_path: Path, spec: dict, env: dict[str, str] | None = None) -> TrainerProcess:
    spec_path, out = tmp_path / "spec.json", tmp_path / "run"
    spec_path.write_text(json.dumps(spec))
    command = trainer_command(sys.executable, spec_path, out, resume=False, num_processes=2)
    base = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return TrainerProcess(command, log_path=tmp_path / "trainer.log", env=base, error_file=out / "error.json")


def _two_processes(**overrides) -> dict:
    return small_spec(distributed={"processes_per_node": 2}, **overrides)


@pytest.mark.slow
def test_a_refused_job_under_torchrun_exits_2_with_the_trainers_reason(tmp_path: Path) -> None:
    task = {"source": "arithmetic", "train_size": 64, "params": {"min_operand": 5, "max_operand": 1}}
    child = _launch(tmp_path, _two_processes(task=task))
    assert child.wait(timeout=300) == ExitCode.USER_ERROR, child.stderr_tail.text()
    assert child.exit_report is not None and child.exit_report.text == f"error: {REFUSED}"
    assert child.proc.returncode == ExitCode.FAILED  # torchrun's own code


@pytest.mark.slow
def test_a_crash_under_torchrun_stays_1_with_the_trainers_traceback(tmp_path: Path) -> None:
    child = _launch(tmp_path, _two_processes(), env={"STARE_INJECT_CRASH_STEP": "1"})
    assert child.wait(timeout=300) == ExitCode.FAILED
    assert child.exit_report is not None, child.stderr_tail.text()
    assert child.exit_report.code == ExitCode.FAILED
    lines = child.exit_report.text.splitlines()
    assert lines[0].startswith("Traceback") and lines[-1] == f"RuntimeError: {CRASH}"


@pytest.mark.slow
def test_a_cooperative_stop_under_torchrun_checkpoints_in_every_process(tmp_path: Path) -> None:
    spec = _two_processes(optim={"steps": 40}, checkpoint={"interval": 100})
    child = _launch(tmp_path, spec, env={"STARE_STEP_DELAY_S": "0.5"})
    while (event := child.events.get(timeout=300)) is not None and event.get("step", 0) < 2:
        pass
    child.request_stop()
    code = child.wait(timeout=300)
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    (stopped,) = [e for e in events if e["type"] == "interrupted"]
    checkpoint = tmp_path / "run" / "checkpoints" / f"step-{stopped['step']:06d}"
    assert (checkpoint / "state.json").is_file() and stopped["step"] >= 2
    assert code == ExitCode.FAILED and child.exit_report is None  # torchrun's own SIGTERM, no code
