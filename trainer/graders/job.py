"""A training job's grader: started with the job (its pool's processes load the tenant's source once),
used by every rollout and evaluation, watched by the step (trainer.graders.health), closed with the job."""

from __future__ import annotations

from collections.abc import Sequence

from contract.graders import GradingSpec
from contract.spec import TrainSpec
from trainer.graders.grading import Grader
from trainer.graders.health import GraderHealth, group_rewards
from trainer.tasks.sources import Example


class JobGrading:
    """`score` a step's samples (rewards and passes, the health recorded), `eval_passes` an evaluation's,
    `step_metrics` once a step, `close` at the end."""

    def __init__(self, grader: Grader, grading: GradingSpec) -> None:
        self.grader = grader
        self.health = GraderHealth(grading, grader.threshold)

    @classmethod
    def start(cls, spec: TrainSpec) -> JobGrading | None:
        """The job's grading, its pool started; None for a job rewarded by a verifier. Raises
        GraderSetupError (the source does not load) or GraderUnavailable (no grader environment here)."""
        if spec.grader is None:
            return None
        grading = spec.grading or GradingSpec()
        return cls(Grader.start(spec.grader, grading.limits, grading.workers), grading)

    def score(
        self, texts: Sequence[str], examples: Sequence[Example], group_size: int
    ) -> tuple[list[float], list[float]]:
        """(rewards, passes) of samples laid out example-major, group_size per example (`examples` holds
        each sample's example). GraderFailed past the job's error budget."""
        outcomes, seconds = self.grader.grade_examples(texts, examples)
        rewards = group_rewards(outcomes, group_size)
        self.health.record(outcomes, rewards, group_size, seconds)
        passes = [float(o.score is not None and o.score >= self.grader.threshold) for o in outcomes]
        return rewards, passes

    def eval_passes(self, texts: Sequence[str], examples: Sequence[Example]) -> list[float]:
        """Each evaluation sample's pass (1.0 when its score reaches the pass threshold). A sample whose
        grading failed does not pass, and counts against the job's error window like a training one."""
        outcomes, _ = self.grader.grade_examples(texts, examples)
        self.health.count(outcomes)
        self.health.check()
        return [float(o.score is not None and o.score >= self.grader.threshold) for o in outcomes]

    def step_metrics(self, step_seconds: float) -> dict[str, float]:
        return self.health.step_metrics(step_seconds)

    def close(self) -> None:
        self.grader.close()
