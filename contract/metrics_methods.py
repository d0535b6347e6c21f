"""The metric catalogue, part two: what the methods' losses and the runtime log: STARE's selection, the
baselines, multi-turn tool use, the rollout engine and evaluation (a controller's own metrics are declared
with it, contract/control). contract/metrics.py joins the parts into CATALOGUE."""

from __future__ import annotations

from contract.metrics_types import Metric, Surface
from contract.metrics_types import metric as _m
from contract.protocol import EventType

_P = Surface.PROMETHEUS
_R = Surface.REPORT
_J = Surface.JOB_VIEW
_G = Surface.GRAFANA


METHODS: tuple[Metric, ...] = (
    # -------------------------------------------------------------------------------------------- STARE
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
        "control/confident_fraction",
        "fraction",
        "Share of active tokens π_old gives p ≥ p_conf: the tokens entropy_split's lowering actuator weights.",
        applies_to="entropy_split",
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
)
