"""Launch and stop: the `run` arguments declared once (trainer.launch.command.add_run_arguments) and built once
(worker.supervisor.run_arguments), the one job entry (trainer.launch.job.run_job) and the stop policies
(trainer.run.events.StopPolicy, AgreedStop) the engine is given."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

import pytest
import torch

from trainer.launch.command import Refused, add_run_arguments, load_job_spec
from trainer.launch.job import run_job
from trainer.launch.ray_driver import _parser as ray_parser
from trainer.run.events import AgreedStop, Interrupted, StopPolicy, stop_policy
from worker.supervisor import ray_command, run_arguments, trainer_command


def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser.add_subparsers(dest="command").add_parser("run"))
    return parser


@pytest.mark.parametrize("resume", [False, True])
def test_the_worker_builds_the_arguments_both_command_lines_read(tmp_path: Path, resume: bool) -> None:
    args = run_arguments(tmp_path / "spec.yaml", tmp_path / "out", resume=resume)
    one_node = _run_parser().parse_args(args)
    ray = ray_parser().parse_args([*args, "--address", "auto"])
    for parsed in (one_node, ray):
        assert parsed.spec == str(tmp_path / "spec.yaml") and parsed.out == str(tmp_path / "out")
        assert parsed.resume is resume and parsed.no_progress and parsed.events_stdout
    # Both launchers take that one list.
    local = trainer_command(
        "python", tmp_path / "spec.yaml", tmp_path / "out", resume=resume, num_processes=1
    )
    assert local[3:] == args
    from types import SimpleNamespace

    settings = SimpleNamespace(
        ray_address="auto",
        ray_connect_timeout_s=1.0,
        ray_start_timeout_s=1.0,
        ray_health_timeout_s=1.0,
        ray_cpus_per_worker=1.0,
        ray_gpus_per_worker=0.0,
    )
    driver = ray_command("python", tmp_path / "spec.yaml", tmp_path / "out", resume=resume, settings=settings)  # type: ignore[arg-type]
    assert driver[3 : 3 + len(args)] == args


def test_a_bad_spec_is_refused_by_the_one_entry(tmp_path: Path) -> None:
    bad = tmp_path / "spec.yaml"
    bad.write_text("optim: {lr: -1}\n")
    with pytest.raises(Refused, match=r"optim\.lr"):
        load_job_spec(bad)
    with pytest.raises(Refused, match="cannot read job spec"):
        run_job(tmp_path / "missing.yaml", tmp_path / "out", resume=False)


def test_a_local_spec_gets_every_problem_at_once_in_plain_words(tmp_path: Path) -> None:
    """`python -m trainer run` says what the API says (contract.spec_problems): each problem on its own line
    at its field path, the name meant for an unknown one, no pydantic wording."""
    bad = tmp_path / "spec.yaml"
    bad.write_text("optim: {learning_rate: 0.001}\nevaluation: {k: 2}\nalgorithm: {name: grop}\n")
    with pytest.raises(Refused) as refused:
        load_job_spec(bad)
    lines = str(refused.value).splitlines()
    assert lines[0] == "invalid job spec:"
    assert {line.split(":")[0].strip() for line in lines[1:]} == {
        "algorithm.name",
        "optim.learning_rate",
        "evaluation.k",
    }
    assert "optim.learning_rate: unknown field; did you mean `lr`?" in str(refused.value)
    assert "did you mean `grpo`?" in str(refused.value)
    assert "Extra inputs" not in str(refused.value) and "Value error" not in str(refused.value)


def _one_process(values: list[float], reduction: str, dtype: torch.dtype) -> torch.Tensor:
    """The reduction over a group of one: this process's own values."""
    return torch.tensor(values, dtype=dtype)


def test_stop_policies() -> None:
    alone = stop_policy(1)
    assert type(alone) is StopPolicy and alone.agreed(_one_process) is None
    alone.request(signal.SIGINT)
    alone.request(signal.SIGTERM)  # the first request is the one reported
    assert alone.agreed(_one_process) == signal.SIGINT
    assert isinstance(stop_policy(2), AgreedStop)
    # In a group of one the agreement is this process's own answer.
    agreed = AgreedStop()
    assert agreed.agreed(_one_process) is None
    agreed.request(signal.SIGTERM)
    assert agreed.agreed(_one_process) == signal.SIGTERM

    # Above one process: where another process was asked, this one (not asked) stops too, with SIGTERM's.
    def other_asked(values: list[float], reduction: str, dtype: torch.dtype) -> torch.Tensor:
        assert reduction == "sum"
        return torch.tensor(values, dtype=dtype) + 1.0

    assert AgreedStop().agreed(other_asked) == signal.SIGTERM
    interrupted = AgreedStop()
    interrupted.request(signal.SIGINT)
    assert interrupted.agreed(other_asked) == signal.SIGINT


def test_a_stop_while_the_run_loads_interrupts_at_once_and_after_it_waits_for_the_step() -> None:
    """Issue 46: the signal handler (Engine.request_stop) stops a run that still loads where it is; once the
    engine starts its step-0 checkpoint (`loading` off) a request waits for the step's end. Interrupted is a
    BaseException, so a loader's `except Exception` cannot swallow it."""
    assert issubclass(Interrupted, BaseException) and not issubclass(Interrupted, Exception)
    policy = StopPolicy()
    policy.interrupt_while_loading()  # nothing requested: nothing happens
    policy.request(signal.SIGTERM)  # a watcher thread's request only sets it
    with pytest.raises(Interrupted):
        policy.interrupt_while_loading()
    policy.loading = False
    policy.interrupt_while_loading()  # training: the step's end decides
    assert policy.agreed(lambda values, op, dtype: values) == signal.SIGTERM
