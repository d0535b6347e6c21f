"""What the training loop does with graded samples, and the grader's health in every step.

Rewards: a sample's reward is its grader score. A sample whose grading failed (trainer.graders.grading:
an exception, a value that is not a finite number, a timeout, a crash) gets no score: its reward is the
mean score of the samples of its group that were graded (0 when none was), so that its advantage is 0 and
it teaches nothing, and it is counted. It never becomes a reward of 0 silently.

The job's error budget: the job ends `grader_failed` when more than `max_error_rate` of the last
`error_window` graded samples failed (default 5 % of 256). Failures are counted against the whole window
from the first step on, so a grader that fails on every sample ends the job on the first step that grades
more than max_error_rate × error_window samples, and a rare failure never does. The error names the first
failure (step, kind, message) and shows its traceback, cut to TRACEBACK_CHARS.

Every step's metrics (contract.metrics_graders): samples graded, failures by kind, the step's and the
window's error rate, the mean and spread of the scores, the share of groups whose rewards are all equal
(no learning signal), and the seconds spent grading.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Any

from contract import metrics_graders as mg
from contract.graders import GradingSpec
from contract.protocol import ErrorCode, EventType
from trainer.graders.grading import Outcome

TRACEBACK_CHARS = 2000


class GraderFailed(Exception):
    """The grader failed on too many samples: the job ends grader_failed (a user error)."""

    def event(self, step: int) -> dict[str, Any]:
        """The `error` event the trainer ends with (exit code GRADER_FAILED)."""
        return {"type": EventType.ERROR, "step": step, "code": ErrorCode.GRADER_FAILED, "message": str(self)}


def group_rewards(outcomes: Sequence[Outcome], group_size: int) -> list[float]:
    """Each sample's reward: its score, or its group's mean graded score when its grading failed."""
    rewards: list[float] = []
    for start in range(0, len(outcomes), group_size):
        group = outcomes[start : start + group_size]
        graded = [o.score for o in group if o.score is not None]
        fill = math.fsum(graded) / len(graded) if graded else 0.0
        rewards.extend(o.score if o.score is not None else fill for o in group)
    return rewards


class GraderHealth:
    """Counts a job's graded samples by step and over the error window; raises GraderFailed."""

    def __init__(self, spec: GradingSpec, threshold: float) -> None:
        self.spec, self.threshold = spec, threshold
        self.window: deque[bool] = deque(maxlen=spec.error_window)  # True: the sample failed
        self.first_error: tuple[int, Outcome] | None = None
        self.step = 0
        self._reset()

    def _reset(self) -> None:
        self.samples, self.seconds = 0, 0.0
        self.kinds: dict[str, int] = {}
        self.scores: list[float] = []
        self.groups = self.equal_groups = 0

    def record(
        self, outcomes: Sequence[Outcome], rewards: Sequence[float], group_size: int, seconds: float
    ) -> None:
        """One batch of training samples (groups of group_size, example-major); GraderFailed past the
        error budget."""
        self.samples += len(outcomes)
        self.seconds += seconds
        self.count(outcomes)
        for outcome in outcomes:
            if outcome.score is not None:
                self.scores.append(outcome.score)
            elif outcome.error is not None:
                self.kinds[outcome.error] = self.kinds.get(outcome.error, 0) + 1
        for start in range(0, len(rewards), group_size):
            group = rewards[start : start + group_size]
            self.groups += 1
            self.equal_groups += int(max(group) == min(group))
        self.check()

    def count(self, outcomes: Sequence[Outcome]) -> None:
        """The samples into the error window (an evaluation's too); the first failure kept."""
        for outcome in outcomes:
            self.window.append(not outcome.ok)
            if not outcome.ok and self.first_error is None:
                self.first_error = (self.step + 1, outcome)

    def failed_in_window(self) -> int:
        return sum(self.window)

    def check(self) -> None:
        failed = self.failed_in_window()
        allowed = self.spec.max_error_rate * self.spec.error_window
        if failed <= allowed:
            return
        assert self.first_error is not None
        step, first = self.first_error
        message = (
            f"the grader failed on {failed} of the last {len(self.window)} samples graded (more than "
            f"{self.spec.max_error_rate:.0%} of {self.spec.error_window}: grading.max_error_rate, "
            f"grading.error_window); the first failure, at step {step}: {first.describe()}"
        )
        if first.traceback:
            trace = first.traceback
            if len(trace) > TRACEBACK_CHARS:
                trace = "[traceback cut]\n" + trace[-TRACEBACK_CHARS:]
            message += "\n" + trace
        raise GraderFailed(message)

    def step_metrics(self, step_seconds: float) -> dict[str, float]:
        """The step's grader metrics; the step's counts start over."""
        self.step += 1
        failed = sum(self.kinds.values())
        spread = statistics.pstdev(self.scores) if len(self.scores) > 1 else 0.0
        metrics = {
            mg.SAMPLES: float(self.samples),
            mg.ERRORS: float(failed),
            mg.EXCEPTIONS: float(self.kinds.get("exception", 0) + self.kinds.get("not_a_number", 0)),
            mg.TIMEOUTS: float(self.kinds.get("timeout", 0)),
            mg.CRASHES: float(self.kinds.get("crashed", 0)),
            mg.NON_FINITE: float(self.kinds.get("non_finite", 0)),
            mg.ERROR_RATE: failed / self.samples if self.samples else 0.0,
            mg.WINDOW_ERROR_RATE: self.failed_in_window() / max(len(self.window), 1),
            mg.SCORE_MEAN: math.fsum(self.scores) / len(self.scores) if self.scores else 0.0,
            mg.SCORE_STD: spread,
            mg.ALL_EQUAL_GROUPS: self.equal_groups / self.groups if self.groups else 0.0,
            mg.SECONDS: self.seconds,
            mg.STEP_SHARE: self.seconds / step_seconds if step_seconds > 0 else 0.0,
        }
        self._reset()
        return metrics
