"""The metric catalogue: every metric key the trainer emits, with its unit, meaning, Prometheus name and
where it is shown. The exporter (worker/metrics.py), the job view (service/views.py), the report, the
Grafana dashboards (monitoring/) and docs/metrics.md read it; `python -m monitoring.docs --write` regenerates
docs/metrics.md (render_markdown here is its catalogue part) and a test fails when the committed file differs.

Also here: the entropy band's state values (-1 below, 0 inside, 1 above), the fleet series the exporter
derives from the job rows, leases and broker rather than from the trainer's metrics, and the API's series
(service/telemetry.py). Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum

from contract import control_metrics
from contract.docs import DOCS
from contract.numbers import finite
from contract.protocol import EventType

DOCS_PATH = DOCS / "metrics.md"


class Surface(StrEnum):
    """Where a metric is shown, beyond the per-step history every step metric has (GET
    /v1/jobs/{id}/metrics, the job's latest_metrics, events.jsonl)."""

    JOB_VIEW = "job view"  # a derived field of the job object (entropy status, ETA)
    REPORT = "report"  # report.json / report.html (trainer/report.py)
    PROMETHEUS = "prometheus"  # the fleet exporter (python -m worker exporter)
    GRAFANA = "grafana"  # a panel of the dashboards (monitoring/ → deploy/grafana/dashboards/)


class PrometheusType(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


class BandState(Enum):
    """Where the step's entropy lies against the entropy band; `entropy/band_state` logs `code`."""

    BELOW = (-1, "below")
    IN_BAND = (0, "in_band")
    ABOVE = (1, "above")

    def __init__(self, code: int, label: str) -> None:
        self.code = code
        self.label = label

    @classmethod
    def of(cls, entropy: float, low: float, high: float) -> BandState:
        """Below when entropy < low, above when entropy > high, else in the band (the edges are inside)."""
        return cls.BELOW if entropy < low else cls.ABOVE if entropy > high else cls.IN_BAND

    @classmethod
    def from_code(cls, value: object) -> BandState:
        """The state a logged `entropy/band_state` stands for: its sign. ValueError for a non-number."""
        number = finite(value)
        if number is None:
            raise ValueError(f"a band state must be a finite number, got {value!r}")
        return {-1: cls.BELOW, 0: cls.IN_BAND, 1: cls.ABOVE}[int(math.copysign(1, number)) if number else 0]

    @classmethod
    def from_label(cls, label: str) -> BandState:
        for state in cls:
            if state.label == label:
                return state
        valid = ", ".join(state.label for state in cls)
        raise ValueError(f"unknown band state {label!r}; valid: {valid}")


@dataclass(frozen=True)
class Metric:
    key: str
    unit: str
    help: str
    event: EventType = EventType.STEP
    applies_to: str = "every algorithm"
    prometheus: str | None = None  # the exporter's series name (labels job_id, algorithm, queue)
    prometheus_type: PrometheusType = PrometheusType.GAUGE
    prometheus_help: str | None = None  # the series' HELP text; default: `help`
    shown: frozenset[Surface] = frozenset()

    def __post_init__(self) -> None:
        if self.event not in (EventType.STEP, EventType.EVAL):
            raise ValueError(f"{self.key}: metrics come with step or eval events, not {self.event!r}")
        if (self.prometheus is not None) != (Surface.PROMETHEUS in self.shown):
            raise ValueError(f"{self.key}: a Prometheus name goes with the prometheus surface")

    @property
    def series_help(self) -> str:
        return self.prometheus_help or self.help


@dataclass(frozen=True)
class FleetSeries:
    """A series the exporter reads from the job rows, the workers' leases or the broker."""

    name: str
    help: str
    labels: tuple[str, ...]
    type: PrometheusType = PrometheusType.GAUGE


JOB_LABELS = ("job_id", "algorithm", "queue")

_P = Surface.PROMETHEUS
_R = Surface.REPORT
_J = Surface.JOB_VIEW
_G = Surface.GRAFANA


def _m(
    key: str,
    unit: str,
    help: str,
    *,
    prometheus: str | None = None,
    prometheus_help: str | None = None,
    shown: Iterable[Surface] = (),
    applies_to: str = "every algorithm",
    event: EventType = EventType.STEP,
) -> Metric:
    # Every exported metric has a panel in the dashboards (tests/monitoring checks both directions).
    surfaces = frozenset(shown) | ({_P, _G} if prometheus else set())
    return Metric(
        key,
        unit,
        help,
        event=event,
        applies_to=applies_to,
        prometheus=prometheus,
        prometheus_help=prometheus_help,
        shown=surfaces,
    )


_QUADRANT_TEXT = {
    "pos_low": ("Â>0 and s<H", "Â>0, s<H"),
    "pos_high": ("Â>0 and s>H", "Â>0, s>H"),
    "neg_low": ("Â<0 and s<H", "Â<0, s<H"),
    "neg_high": ("Â<0 and s>H", "Â<0, s>H"),
}


def _quadrants() -> list[Metric]:
    out = []
    for name, (share, drift) in _QUADRANT_TEXT.items():
        out.append(
            _m(
                f"quadrant/{name}_fraction",
                "fraction",
                f"Share of the step's active tokens with {share} (surprisal s against the position's entropy H).",
                prometheus=f"stare_job_quadrant_{name}_fraction",
                prometheus_help=f"Token share with {share}.",
                shown=[_R],
            )
        )
        out.append(
            _m(
                f"quadrant/{name}_drift",
                "nats per unit step",
                f"Predicted first-order entropy change from the tokens with {drift}: Σ Â·Φ over them, "
                "divided by the step's active tokens (docs/ALGORITHMS.md §1).",
                prometheus=f"stare_job_quadrant_{name}_drift",
                prometheus_help=f"Predicted entropy drift from {drift}.",
                shown=[_R],
            )
        )
    return out


CATALOGUE: tuple[Metric, ...] = (
    # ----------------------------------------------------------------------------- entropy and its band
    _m(
        "entropy/mean",
        "nats",
        "Token-mean entropy of π_old over the step's active response tokens (H̄).",
        prometheus="stare_job_entropy_nats",
        prometheus_help="Token-mean policy entropy of the last step (π_old, nats).",
        shown=[_J, _R],
    ),
    _m(
        "entropy/band_low",
        "nats",
        "Lower edge of the job's entropy band (entropy_band.low; with a relative target and no band set, "
        "0.5 × entropy/target).",
        prometheus="stare_job_entropy_band_low_nats",
        prometheus_help="Lower edge of the job's entropy band.",
        shown=[_J, _R],
    ),
    _m(
        "entropy/band_high",
        "nats",
        "Upper edge of the job's entropy band (entropy_band.high; with a relative target and no band set, "
        "2 × entropy/target).",
        prometheus="stare_job_entropy_band_high_nats",
        prometheus_help="Upper edge of the job's entropy band.",
        shown=[_J, _R],
    ),
    _m(
        "entropy/target",
        "nats",
        "The controller's target entropy, resolved: algorithm.gate.target_entropy (stare) or "
        "algorithm.entropy_control.target_entropy (adaptive_entropy), nats or {relative: r} × H₀ (H₀: "
        "entropy/mean of the first RL step).",
        prometheus="stare_job_target_entropy_resolved_nats",
        prometheus_help="The job's resolved target entropy.",
        shown=[_J, _R],
        applies_to="stare, adaptive_entropy",
    ),
    _m(
        "entropy/band_state",
        "state",
        "Where entropy/mean lies against the band: -1 below, 0 inside (edges included), 1 above.",
        prometheus="stare_job_entropy_band_state",
        prometheus_help="-1 below the band, 0 inside, 1 above.",
        shown=[_J, _R],
    ),
    _m(
        "entropy/steps_out_of_band",
        "steps",
        "Consecutive steps, up to this one, whose entropy was outside the band (0 inside).",
        prometheus="stare_job_entropy_steps_out_of_band",
        prometheus_help="Consecutive steps outside the band.",
        shown=[_J],
    ),
    _m(
        "entropy/collapse_step",
        "step",
        "Time to collapse: the first RL step from which entropy/mean stayed below 0.25 × its first-step value "
        "for 5 consecutive steps; 0 while it has not (contract/stability.py).",
        prometheus="stare_job_entropy_collapse_step",
        prometheus_help="First step of the entropy collapse (0: not collapsed).",
        shown=[_J, _R],
    ),
    _m(
        "entropy/target_hold_fraction",
        "fraction",
        "Share of the post-gate steps (from the first step whose entropy/mean was below entropy/target) "
        "with entropy/mean within ±25 % of the target (contract/stability.py).",
        prometheus="stare_job_entropy_target_hold_fraction",
        prometheus_help="Share of post-gate steps within 25 % of the target entropy.",
        shown=[_J, _R],
        applies_to="stare, adaptive_entropy",
    ),
    _m(
        "entropy/post_gate_steps",
        "steps",
        "Steps since the first one whose entropy/mean was below entropy/target, that one included (0 before).",
        prometheus="stare_job_entropy_post_gate_steps",
        prometheus_help="Steps since entropy first fell below the target.",
        shown=[_J],
        applies_to="stare, adaptive_entropy",
    ),
    # ------------------------------------------------------------------------------------------ rewards
    _m(
        "reward/mean",
        "reward",
        "Mean shaped reward of the step's responses.",
        prometheus="stare_job_reward_mean",
        prometheus_help="Mean shaped reward of the step's responses.",
        shown=[_R],
    ),
    _m("reward/std", "reward", "Standard deviation (unbiased) of the step's shaped rewards."),
    _m(
        "reward/accuracy",
        "fraction",
        "Mean verifier score of the step's responses (1 right, 0 wrong; partial credit possible).",
        prometheus="stare_job_accuracy",
        prometheus_help="Verifier accuracy of the step's responses.",
        shown=[_R],
    ),
    _m(
        "reward/zero_std_fraction",
        "fraction",
        "Share of the step's responses whose group (of two or more) has all rewards equal: zero advantage.",
        prometheus="stare_job_zero_variance_group_fraction",
        prometheus_help="Groups whose rewards are all equal.",
    ),
    _m("advantage/mean", "advantage", "Mean advantage over the step's responses."),
    _m("advantage/abs_mean", "advantage", "Mean absolute advantage over the step's responses."),
    # ---------------------------------------------------------------------------------------- responses
    _m(
        "response/length_mean",
        "tokens",
        "Mean response length of the step.",
        prometheus="stare_job_response_length_tokens",
        prometheus_help="Mean response length.",
        shown=[_R],
    ),
    _m("response/length_max", "tokens", "Longest response of the step."),
    _m(
        "response/truncated_fraction",
        "fraction",
        "Share of the step's responses cut at sampling.max_new_tokens.",
        prometheus="stare_job_truncated_fraction",
        prometheus_help="Share of responses cut at max_new_tokens.",
    ),
    _m(
        "response/reflection_rate",
        "per response",
        "Reflection phrases ('wait', 'let me check', ...) per response.",
        prometheus="stare_job_reflection_rate",
        prometheus_help="Reflection phrases per response.",
    ),
    # --------------------------------------------------------------------------------- the policy loss
    _m(
        "loss/policy",
        "loss",
        "The step's policy loss (the sum of its micro-batches' shares), before the optimiser step.",
    ),
    _m(
        "clip/fraction",
        "fraction",
        "Share of active tokens whose ratio left the clip range in the direction of their advantage.",
        prometheus="stare_job_clip_fraction",
        prometheus_help="Share of tokens whose ratio was clipped.",
    ),
    _m(
        "clip/low_fraction",
        "fraction",
        "Share of active tokens with Â < 0 and ρ < 1 − ε_low.",
        prometheus="stare_job_clip_low_fraction",
        prometheus_help="Share of tokens clipped at 1 - eps_low (negative advantage).",
    ),
    _m(
        "clip/high_fraction",
        "fraction",
        "Share of active tokens with Â > 0 and ρ > 1 + ε_high.",
        prometheus="stare_job_clip_high_fraction",
        prometheus_help="Share of tokens clipped at 1 + eps_high (positive advantage).",
    ),
    _m(
        "clip/dual_fraction",
        "fraction",
        "Share of active tokens capped by the dual clip (Â < 0, loss above −c·Â).",
        prometheus="stare_job_dual_clip_fraction",
        prometheus_help="Share of tokens under the dual clip.",
    ),
    _m(
        "kl/approx_old",
        "nats",
        "Token-mean ℓ_old − ℓ_θ: the approximate KL from the behaviour policy (0 on-policy, first epoch).",
        prometheus="stare_job_approx_kl",
        prometheus_help="Approximate KL to the behaviour policy.",
    ),
    _m(
        "kl/ref_k3",
        "nats",
        "Token-mean k3 estimate of the KL to the reference policy.",
        applies_to="optim.kl_beta > 0",
    ),
    # ------------------------------------------------------------------------------------ optimisation
    _m(
        "actor/grad_norm",
        "norm",
        "Gradient norm before clipping (NaN when optim.grad_clip is off).",
        prometheus="stare_job_grad_norm",
        prometheus_help="Gradient norm before clipping (absent when grad_clip is off).",
    ),
    _m("actor/lr", "learning rate", "Learning rate of the step's optimiser update."),
    _m(
        "data/responses",
        "responses",
        "Responses in the step's training batch, over every process (after dynamic sampling).",
    ),
    # ------------------------------------------------------------------------------------- performance
    _m(
        "perf/step_seconds",
        "seconds",
        "Wall time of the step (generation and update).",
        prometheus="stare_job_step_seconds",
        prometheus_help="Wall time of the last step.",
        shown=[_J, _R],
    ),
    _m("perf/generation_seconds", "seconds", "Wall time of the step's rollout (generation, rewards)."),
    _m("perf/update_seconds", "seconds", "Wall time of the step's scoring passes and optimiser update."),
    _m(
        "perf/tokens_per_second",
        "tokens/s",
        "Prompt and response tokens of the step over its wall time.",
        prometheus="stare_job_tokens_per_second",
        prometheus_help="Tokens processed per second in the step.",
        shown=[_R],
    ),
    _m(
        "perf/gen_batches",
        "batches",
        "Generation batches the step drew (more than 1 only with dynamic sampling).",
    ),
    _m(
        "memory/model_state_bytes",
        "bytes",
        "Parameters, gradients and optimizer state the first process holds after the step's optimizer step "
        "(under fsdp2 its shards: about 1/N of the whole).",
    ),
    _m(
        "memory/model_state_bytes_all",
        "bytes",
        "memory/model_state_bytes summed over every process (fsdp2: the whole once; ddp: N copies).",
    ),
    # --------------------------------------------------------------------------- entropy dynamics (§1)
    *_quadrants(),
    _m(
        "quadrant/predicted_drift",
        "nats per unit step",
        "Sum of the four quadrants' predicted drifts: the first-order entropy change of the update.",
        prometheus="stare_job_predicted_entropy_drift",
        prometheus_help="Total first-order entropy drift.",
        shown=[_R],
    ),
    # -------------------------------------------------------------------------------------------- STARE
    _m(
        "stare/gate_on",
        "flag",
        "The target-entropy gate: 1 when H̄ < H_tgt (reweighting on), else 0.",
        prometheus="stare_job_gate_on",
        prometheus_help="STARE target-entropy gate (1 on, 0 off).",
        shown=[_R],
        applies_to="stare",
    ),
    _m(
        "stare/reweight_w",
        "weight",
        "W, the weight of the selected high-surprisal tokens with Â > 0 (L⁺).",
        prometheus="stare_job_reweight_w",
        prometheus_help="STARE weight W on high-surprisal positive tokens.",
        shown=[_R],
        applies_to="stare",
    ),
    _m(
        "stare/reweight_m",
        "weight",
        "M, the weight of the selected high-surprisal tokens with Â < 0 (L⁻, variant C2).",
        prometheus="stare_job_reweight_m",
        prometheus_help="STARE weight M on high-surprisal negative tokens (C2).",
        shown=[_R],
        applies_to="stare",
    ),
    _m(
        "stare/target_entropy",
        "nats",
        "H_tgt, the gate's target entropy (algorithm.gate.target_entropy, resolved).",
        prometheus="stare_job_target_entropy_nats",
        prometheus_help="STARE target entropy.",
        shown=[_R],
        applies_to="stare",
    ),
    _m(
        "stare/batch_entropy",
        "nats",
        "H̄ as the gate measured it (equal to entropy/mean).",
        applies_to="stare",
    ),
    _m(
        "stare/mean_weight",
        "weight",
        "Mean token weight ω over the active tokens (1 when the gate is off).",
        prometheus="stare_job_mean_weight",
        prometheus_help="Mean STARE token weight over active tokens.",
        applies_to="stare",
    ),
    _m(
        "stare/positive_candidate_ratio",
        "fraction",
        "|T⁺| / N: share of active tokens with Â > 0.",
        applies_to="stare",
    ),
    _m(
        "stare/negative_candidate_ratio",
        "fraction",
        "|T⁻| / N: share of active tokens with Â < 0.",
        applies_to="stare",
    ),
    _m(
        "stare/positive_reweight_ratio",
        "fraction",
        "|L⁺| / N: share of active tokens weighted W (0 when the gate is off).",
        applies_to="stare",
    ),
    _m(
        "stare/negative_reweight_ratio",
        "fraction",
        "|L⁻| / N: share of active tokens weighted M (C2 only; 0 when the gate is off).",
        applies_to="stare",
    ),
    # ------------------------------------------------------------------------------------ the baselines
    _m("rsi/kept_ratio", "fraction", "Share of active tokens RSI-S keeps in the loss.", applies_to="rsi_s"),
    _m(
        "rsi/dropped_low_fraction",
        "fraction",
        "Share of active tokens dropped for RSI below the lower bound.",
        applies_to="rsi_s",
    ),
    _m(
        "rsi/dropped_high_fraction",
        "fraction",
        "Share of active tokens dropped for RSI above the upper bound.",
        applies_to="rsi_s",
    ),
    _m("rsi/mean", "ratio", "Mean RSI = s / max(H, eps) over active tokens.", applies_to="rsi_s"),
    _m("rsi/std", "ratio", "Standard deviation (population) of RSI over active tokens.", applies_to="rsi_s"),
    _m(
        "forking/kept_ratio",
        "fraction",
        "Share of active tokens kept as high-entropy forking tokens.",
        applies_to="forking_8020",
    ),
    _m(
        "clip_cov/zeroed_fraction",
        "fraction",
        "Share of active tokens whose gradient Clip-Cov removed.",
        applies_to="clip_cov",
    ),
    _m(
        "clip_cov/window_fraction",
        "fraction",
        "Share of active tokens in Clip-Cov's covariance window (unclipped, cov_lower < cov < cov_upper).",
        applies_to="clip_cov",
    ),
    _m(
        "kl_cov/penalised_fraction",
        "fraction",
        "Share of active tokens KL-Cov penalised (the top ones by covariance).",
        applies_to="kl_cov",
    ),
    _m(
        "entropy_bonus/coef",
        "coefficient",
        "α, the entropy bonus's coefficient applied at this step (0 when H̄ ≥ H_tgt).",
        applies_to="adaptive_entropy",
    ),
    _m(
        "entropy_bonus/active",
        "flag",
        "1 when the entropy bonus acted at this step (α > 0), else 0.",
        applies_to="adaptive_entropy",
    ),
    _m(
        "entropy_bonus/target_entropy",
        "nats",
        "H_tgt the coefficient adapts toward (algorithm.entropy_control.target_entropy, resolved).",
        applies_to="adaptive_entropy",
    ),
    # ------------------------------------------------------------------------------- multi-turn tool use
    # Emitted by jobs with a tool-use environment (spec `environment`); absent from other jobs.
    _m(
        "tool/calls_per_response",
        "calls",
        "Mean tool calls per episode (response) of the step; malformed calls count (they are tool errors).",
        applies_to="tool-use environments",
        prometheus="stare_job_tool_calls_per_response",
    ),
    _m(
        "tool/error_rate",
        "fraction",
        "Share of the step's tool calls that ended in a tool error (malformed call, exception, limit hit).",
        applies_to="tool-use environments",
        prometheus="stare_job_tool_error_rate",
    ),
    _m(
        "tool/timeout_rate",
        "fraction",
        "Share of the step's tool calls stopped by the CPU-time or wall-time limit.",
        applies_to="tool-use environments",
        prometheus="stare_job_tool_timeout_rate",
    ),
    _m(
        "tool/turns_per_episode",
        "turns",
        "Mean model turns per episode of the step.",
        applies_to="tool-use environments",
        prometheus="stare_job_tool_turns_per_episode",
    ),
    _m(
        "tool/output_token_fraction",
        "fraction",
        "Share of the step's response tokens that are tool output (masked out of the loss).",
        applies_to="tool-use environments",
        prometheus="stare_job_tool_output_token_fraction",
    ),
    _m(
        "tool/token_mismatches",
        "tokens",
        "Tokens whose ids in the trained sequence differ from the ids the model saw or produced, summed over the "
        "step's episodes (must be 0: rollouts keep token ids per turn, never re-tokenised text).",
        applies_to="tool-use environments",
        prometheus="stare_job_tool_token_mismatches",
    ),
    # ------------------------------------------------------------------------------ rollout engine
    _m(
        "rollout/mismatch_abs_mean",
        "nats",
        "Mean over the step's sampled tokens of |log π_sampler − log π_trainer|: the rollout engine's "
        "log-prob of each token against the trainer's (π_old, before the update).",
        applies_to="rollout.engine vllm",
        prometheus="stare_job_rollout_mismatch_abs_mean",
        shown=[_R],
    ),
    _m(
        "rollout/mismatch_abs_max",
        "nats",
        "Largest |log π_sampler − log π_trainer| over the step's sampled tokens.",
        applies_to="rollout.engine vllm",
        prometheus="stare_job_rollout_mismatch_abs_max",
    ),
    _m(
        "rollout/mismatch_kl",
        "nats",
        "KL(π_sampler ‖ π_trainer) per token, the k3 estimator on the sampled tokens: mean of r − 1 − log r, "
        "r = π_trainer/π_sampler (unbiased, never negative).",
        applies_to="rollout.engine vllm",
        prometheus="stare_job_rollout_mismatch_kl",
        shown=[_R],
    ),
    _m(
        "rollout/tis_weight_mean",
        "ratio",
        "Mean truncated importance weight min(π_trainer/π_sampler, rollout.tis_cap) over the sampled tokens.",
        applies_to="rollout.tis_cap set",
        prometheus="stare_job_rollout_tis_weight_mean",
    ),
    _m(
        "rollout/tis_capped_fraction",
        "fraction",
        "Share of the sampled tokens whose ratio π_trainer/π_sampler exceeded rollout.tis_cap.",
        applies_to="rollout.tis_cap set",
    ),
    # --------------------------------------------------------------------------------------- evaluation
    _m(
        "eval/avg@k",
        "fraction",
        "Mean verifier score over the evaluation prompts and their k samples (accuracy when greedy).",
        event=EventType.EVAL,
        prometheus="stare_job_eval_avg_at_k",
        prometheus_help="Held-out avg@k of the job's latest evaluation.",
        shown=[_R],
    ),
    _m(
        "eval/pass@k",
        "fraction",
        "Share of evaluation prompts with at least one of k samples scored 1.",
        event=EventType.EVAL,
        prometheus="stare_job_eval_pass_at_k",
        prometheus_help="Held-out pass@k of the job's latest evaluation.",
        shown=[_R],
    ),
    _m("eval/k", "samples", "Samples per evaluation prompt.", event=EventType.EVAL, shown=[_R]),
    _m(
        "eval/response_length",
        "tokens",
        "Mean length of the evaluation responses.",
        event=EventType.EVAL,
        shown=[_R],
    ),
    _m(
        "eval/num_prompts",
        "prompts",
        "Evaluation prompts scored.",
        event=EventType.EVAL,
        shown=[_R],
    ),
    # The PI entropy laws and the holding statistics: contract/control_metrics.py.
    *control_metrics.entries(_m, {s.value: s for s in Surface}),
)

FLEET_SERIES: tuple[FleetSeries, ...] = (
    FleetSeries("stare_job_step", "Last completed step.", JOB_LABELS),
    FleetSeries("stare_job_total_steps", "Steps the job will run.", JOB_LABELS),
    FleetSeries(
        "stare_job_heartbeat_age_seconds",
        "Seconds since the job's worker last renewed its lease.",
        JOB_LABELS,
    ),
    FleetSeries("stare_workers_busy", "Workers holding a job lease, by queue.", ("queue",)),
    FleetSeries(
        "stare_workers",
        "Workers of the queue: the busy ones plus the idle ones (Redis broker only).",
        ("queue",),
    ),
    FleetSeries(
        "stare_workers_idle",
        "Workers consuming the queue and running no job: those that answer a Celery ping (Redis broker only).",
        ("queue",),
    ),
    FleetSeries(
        "stare_failed_jobs",
        "Jobs that ended failed, by the error code the worker or sweeper recorded (every known code, 0 too).",
        ("code", "queue"),
    ),
    FleetSeries("stare_queue_messages", "Messages waiting on the broker, by queue.", ("queue",)),
    FleetSeries("stare_fleet_scrape_ok", "1 when the last scrape read the database.", ()),
)


# The API process's series (service/telemetry.py), as Prometheus exposes them (a counter gains `_total`, a
# histogram `_bucket`, `_sum` and `_count`).
API_SERIES: tuple[FleetSeries, ...] = (
    FleetSeries(
        "stare_http_requests_total",
        "HTTP requests served.",
        ("route", "method", "status_class"),
        PrometheusType.COUNTER,
    ),
    FleetSeries(
        "stare_http_request_duration_seconds",
        "Time to the end of the response.",
        ("route", "method"),
        PrometheusType.HISTOGRAM,
    ),
    FleetSeries(
        "stare_enqueue_failures_total",
        "Jobs committed whose doorbell could not be sent.",
        (),
        PrometheusType.COUNTER,
    ),
    FleetSeries("stare_jobs", "Jobs by status and queue.", ("status", "queue")),
    FleetSeries("stare_database_up", "1 when the last scrape could read the database.", ()),
)


def series_names(series: FleetSeries) -> tuple[str, ...]:
    """The sample names a series is exposed under: a histogram's _bucket, _sum and _count."""
    if series.type is PrometheusType.HISTOGRAM:
        return tuple(f"{series.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
    return (series.name,)


def _index() -> dict[str, Metric]:
    by_key: dict[str, Metric] = {}
    names: set[str] = {series.name for series in (*FLEET_SERIES, *API_SERIES)}
    for metric in CATALOGUE:
        if metric.key in by_key:
            raise ValueError(f"metric {metric.key!r} is catalogued twice")
        by_key[metric.key] = metric
        if metric.prometheus is not None:
            if metric.prometheus in names:
                raise ValueError(f"Prometheus name {metric.prometheus!r} is used twice")
            names.add(metric.prometheus)
    return by_key


METRICS: dict[str, Metric] = _index()  # checked at import: keys and Prometheus names are unique


def get(key: str) -> Metric:
    try:
        return METRICS[key]
    except KeyError:
        raise ValueError(f"unknown metric {key!r} (not in contract.metrics.CATALOGUE)") from None


def prometheus_metrics(event: EventType | None = None) -> list[Metric]:
    """The metrics the exporter publishes, in catalogue order (of one event type when given: step metrics
    come from the job's latest step, eval metrics from its latest evaluation)."""
    return [m for m in CATALOGUE if m.prometheus is not None and (event is None or m.event is event)]


def fleet_series(name: str) -> FleetSeries:
    for series in FLEET_SERIES:
        if series.name == name:
            return series
    raise ValueError(f"unknown fleet series {name!r}; valid: {', '.join(s.name for s in FLEET_SERIES)}")


# Keys the job view and the report read by name.
ENTROPY = get("entropy/mean").key
BAND_LOW = get("entropy/band_low").key
BAND_HIGH = get("entropy/band_high").key
BAND_STATE = get("entropy/band_state").key
STEPS_OUT_OF_BAND = get("entropy/steps_out_of_band").key
COLLAPSE_STEP = get("entropy/collapse_step").key
TARGET_HOLD_FRACTION = get("entropy/target_hold_fraction").key
POST_GATE_STEPS = get("entropy/post_gate_steps").key
TARGET_ENTROPY = get("entropy/target").key
STEP_SECONDS = get("perf/step_seconds").key


# ------------------------------------------------------------------------------------------ docs/metrics.md


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(panels: Mapping[str, Sequence[str]] | None = None) -> str:
    """The catalogue part of docs/metrics.md; `panels` maps a Prometheus series name to the dashboard panels
    that read it (monitoring.docs passes it and appends the dashboards' tables)."""
    panels = panels or {}

    def where(name: str | None) -> str:
        return "; ".join(_cell(p) for p in panels.get(name or "", ()))

    lines = [
        "# Metrics",
        "",
        "Generated from `contract/metrics.py`, the dashboards' source (`monitoring/`) and the values the",
        "integration test recorded (`deploy/grafana/query-results.json`) by `python -m monitoring.docs --write`;",
        "do not edit by hand (tests/contract/test_metrics.py fails when this file and its sources differ).",
        "",
        "Every step metric is in the job's per-step history (`GET /v1/jobs/{id}/metrics`), its",
        "`latest_metrics` and the run's `events.jsonl` (`step` events; `eval/*` come with `eval` events).",
        "*Shown* lists where else a metric is read: the job view's derived fields (entropy status, ETA),",
        "the report (`report.json`, `report.html`), the Prometheus exporter (`python -m worker exporter`,",
        "labels " + ", ".join(f"`{label}`" for label in JOB_LABELS) + ") and the Grafana dashboards",
        "(`deploy/grafana/dashboards/`, generated from `monitoring/`; *panels* names them). An exported eval",
        "metric is the job's latest evaluation. How to run Grafana and Prometheus: docs/MONITORING.md.",
        "",
        "## Trainer metrics",
        "",
        "| key | event | unit | applies to | meaning | Prometheus | shown | panels |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in CATALOGUE:
        prom = f"`{m.prometheus}` ({m.prometheus_type.value})" if m.prometheus else ""
        shown = ", ".join(s.value for s in Surface if s in m.shown)
        lines.append(
            f"| `{m.key}` | {m.event.value} | {_cell(m.unit)} | {_cell(m.applies_to)} | {_cell(m.help)} "
            f"| {prom} | {shown} | {where(m.prometheus)} |"
        )
    lines += [
        "",
        "## Entropy band states",
        "",
        "`entropy/band_state` logs the code; the job view's `entropy.state` and the report use the name.",
        "",
        "| code | name |",
        "|---|---|",
        *(f"| {state.code} | `{state.label}` |" for state in BandState),
        "",
        "## Fleet series",
        "",
        "The exporter's series that come from the job rows, the leases and the broker, not from a metric.",
        "",
        *_series_table(FLEET_SERIES, where),
        "",
        "## API series",
        "",
        "The API process's own series (`GET /metrics` of `python -m service serve`, service/telemetry.py).",
        "",
        *_series_table(API_SERIES, where),
        "",
    ]
    return "\n".join(lines)


def _series_table(series: Iterable[FleetSeries], where: Callable[[str], str]) -> list[str]:
    rows = ["| Prometheus | type | labels | meaning | panels |", "|---|---|---|---|---|"]
    for s in series:
        labels = ", ".join(f"`{label}`" for label in s.labels)
        rows.append(f"| `{s.name}` | {s.type.value} | {labels} | {_cell(s.help)} | {where(s.name)} |")
    return rows
