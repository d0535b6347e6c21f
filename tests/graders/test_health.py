"""What training does with graded samples (trainer/graders/health.py): a failed grading never becomes a
reward of 0 (its group's mean score: no advantage), the step's grader metrics, and the error budget that
ends a job grader_failed, naming the first failure with its traceback cut."""

from __future__ import annotations

import pytest

from contract import metrics_graders as mg
from contract.graders import GradingSpec
from contract.metrics import CATALOGUE
from contract.protocol import ErrorCode, EventType, check_event
from trainer.graders.grading import Outcome
from trainer.graders.health import TRACEBACK_CHARS, GraderFailed, GraderHealth, group_rewards

OK = Outcome(1.0)
ZERO = Outcome(0.0)
RAISED = Outcome(
    None, "exception", "KeyError: 'x'", "Traceback (most recent call last):\n" + "  line\n" * 2000
)
TIMED_OUT = Outcome(None, "timeout", "grading ran past its budget of 2 s")


def test_a_failed_sample_gets_its_groups_mean_score_never_zero() -> None:
    outcomes = [OK, ZERO, RAISED, OK, TIMED_OUT, TIMED_OUT, TIMED_OUT, TIMED_OUT]
    rewards = group_rewards(outcomes, group_size=4)
    assert rewards[:4] == [1.0, 0.0, 2 / 3, 1.0]
    assert rewards[4:] == [0.0, 0.0, 0.0, 0.0]  # a group with no graded sample: all equal, no advantage


def test_the_steps_metrics_count_every_kind_and_start_over() -> None:
    health = GraderHealth(GradingSpec(error_window=1000), threshold=1.0)
    outcomes = [OK, ZERO, RAISED, OK, Outcome(None, "non_finite", "nan"), OK, OK, OK]
    health.record(outcomes, group_rewards(outcomes, 4), group_size=4, seconds=0.5)
    metrics = health.step_metrics(step_seconds=10.0)
    assert set(metrics) == {m.key for m in CATALOGUE if m.key.startswith("grader/")}
    assert metrics[mg.SAMPLES] == 8 and metrics[mg.ERRORS] == 2 and metrics[mg.EXCEPTIONS] == 1
    assert metrics[mg.NON_FINITE] == 1 and metrics[mg.TIMEOUTS] == 0 and metrics[mg.ERROR_RATE] == 0.25
    assert metrics[mg.SCORE_MEAN] == pytest.approx(5 / 6)
    assert metrics[mg.ALL_EQUAL_GROUPS] == 0.5  # the second group: 1.0 (fill), 1.0, 1.0, 1.0
    assert metrics[mg.STEP_SHARE] == 0.05 and metrics[mg.SECONDS] == 0.5
    assert health.step_metrics(1.0)[mg.SAMPLES] == 0


def test_past_the_error_budget_the_job_ends_naming_the_first_failure_with_its_traceback_cut() -> None:
    health = GraderHealth(GradingSpec(max_error_rate=0.05, error_window=100), threshold=1.0)
    health.record([OK] * 20 + [RAISED] * 5, [1.0] * 25, group_size=5, seconds=0.1)  # 5 ≤ 5 % of 100
    health.step_metrics(1.0)
    with pytest.raises(GraderFailed) as failed:
        health.record([TIMED_OUT] + [OK] * 4, [1.0] * 5, group_size=5, seconds=0.1)
    message = str(failed.value)
    assert (
        "failed on 6 of the last 30 samples" in message and "at step 1: exception: KeyError: 'x'" in message
    )
    assert "[traceback cut]" in message and len(message) < TRACEBACK_CHARS + 600
    event = check_event({**failed.value.event(2), "time": "t"})
    assert event["type"] == EventType.ERROR and event["code"] == ErrorCode.GRADER_FAILED


def test_rare_failures_never_end_the_job() -> None:
    health = GraderHealth(GradingSpec(max_error_rate=0.05, error_window=256), threshold=1.0)
    for _ in range(50):  # one failure in 64 samples, step after step: 4 in any window of 256
        health.record([RAISED] + [OK] * 63, [1.0] * 64, group_size=8, seconds=0.0)
        health.step_metrics(1.0)
    assert health.failed_in_window() == 4
