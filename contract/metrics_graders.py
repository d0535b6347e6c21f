"""The metric catalogue, part three: a tenant grader's health, logged by every step of a job with a `grader`
(contract/graders.py; trainer/graders/health.py computes them) and absent from other jobs. Counts are of the
step's training samples; a failed sample is one whose grading raised, returned something that is not a
finite number, ran past its time budget or crashed its process (docs/GRADERS.md)."""

from __future__ import annotations

from contract.metrics_types import Metric, Surface
from contract.metrics_types import metric as _m

_J = Surface.JOB_VIEW
_R = Surface.REPORT
_APPLIES = "jobs with a grader"

SAMPLES = "grader/samples"
ERRORS = "grader/errors"
EXCEPTIONS = "grader/exceptions"
TIMEOUTS = "grader/timeouts"
CRASHES = "grader/crashes"
NON_FINITE = "grader/non_finite"
ERROR_RATE = "grader/error_rate"
WINDOW_ERROR_RATE = "grader/window_error_rate"
SCORE_MEAN = "grader/score_mean"
SCORE_STD = "grader/score_std"
ALL_EQUAL_GROUPS = "grader/all_equal_groups"
SECONDS = "grader/seconds"
STEP_SHARE = "grader/step_share"

GRADERS: tuple[Metric, ...] = (
    _m(SAMPLES, "samples", "Training samples the grader graded this step.", applies_to=_APPLIES, shown=[_J]),
    _m(
        ERRORS,
        "samples",
        "Samples whose grading failed this step (every kind: exception, not a number, non-finite, "
        "timeout, crash, template, formula). They get their group's mean score: no advantage.",
        applies_to=_APPLIES,
        prometheus="stare_job_grader_errors",
        prometheus_help="Samples whose grading failed in the last step.",
        shown=[_J, _R],
    ),
    _m(
        EXCEPTIONS,
        "samples",
        "Samples whose grader raised, or returned something that is not a number, this step.",
        applies_to=_APPLIES,
        shown=[_J],
    ),
    _m(
        TIMEOUTS,
        "samples",
        "Samples whose grading ran past grading.limits.timeout_s this step (the process was replaced).",
        applies_to=_APPLIES,
        prometheus="stare_job_grader_timeouts",
        prometheus_help="Samples whose grading timed out in the last step.",
        shown=[_J, _R],
    ),
    _m(
        CRASHES,
        "samples",
        "Samples whose grader process died or broke the protocol this step (it was replaced).",
        applies_to=_APPLIES,
        shown=[_J],
    ),
    _m(
        NON_FINITE,
        "samples",
        "Samples whose grader returned NaN or an infinity this step.",
        applies_to=_APPLIES,
        prometheus="stare_job_grader_non_finite",
        prometheus_help="Samples whose grader returned a non-finite score in the last step.",
        shown=[_J],
    ),
    _m(
        ERROR_RATE,
        "fraction",
        "Share of the step's samples whose grading failed.",
        applies_to=_APPLIES,
        prometheus="stare_job_grader_error_rate",
        prometheus_help="Share of the last step's samples whose grading failed.",
        shown=[_J, _R],
    ),
    _m(
        WINDOW_ERROR_RATE,
        "fraction",
        "Share of failures among the last grading.error_window samples graded; the job ends grader_failed "
        "when failures pass grading.max_error_rate × error_window (docs/GRADERS.md).",
        applies_to=_APPLIES,
        prometheus="stare_job_grader_window_error_rate",
        prometheus_help="Share of grading failures over the job's error window.",
        shown=[_J, _R],
    ),
    _m(
        SCORE_MEAN,
        "score",
        "Mean grader score of the step's graded samples.",
        applies_to=_APPLIES,
        prometheus="stare_job_grader_score_mean",
        prometheus_help="Mean grader score of the last step.",
        shown=[_J, _R],
    ),
    _m(
        SCORE_STD,
        "score",
        "Spread (population standard deviation) of the step's grader scores.",
        applies_to=_APPLIES,
        prometheus="stare_job_grader_score_std",
        prometheus_help="Spread of the last step's grader scores.",
        shown=[_J, _R],
    ),
    _m(
        ALL_EQUAL_GROUPS,
        "fraction",
        "Share of the step's groups whose samples' rewards are all equal (no advantage: nothing to learn).",
        applies_to=_APPLIES,
        prometheus="stare_job_grader_all_equal_groups",
        prometheus_help="Share of the last step's groups with all-equal rewards.",
        shown=[_J, _R],
    ),
    _m(
        SECONDS,
        "seconds",
        "Wall time spent grading the step's samples.",
        applies_to=_APPLIES,
        prometheus="stare_job_grader_seconds",
        prometheus_help="Seconds spent grading in the last step.",
        shown=[_J],
    ),
    _m(
        STEP_SHARE,
        "fraction",
        "grader/seconds over the step's wall time (the goal: ≤ 5 %, docs/BENCHMARKS.md).",
        applies_to=_APPLIES,
        prometheus="stare_job_grader_step_share",
        prometheus_help="Share of the last step's time spent grading.",
        shown=[_J, _R],
    ),
)
