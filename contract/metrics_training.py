"""The metric catalogue, part one: what every training step logs, whatever the algorithm: entropy and its
band, rewards, responses, the policy loss, optimisation, performance and the entropy dynamics (the
quadrants). contract/metrics.py joins the parts into CATALOGUE."""

from __future__ import annotations

from contract.metrics_types import Metric, Surface
from contract.metrics_types import metric as _m

_P = Surface.PROMETHEUS
_R = Surface.REPORT
_J = Surface.JOB_VIEW
_G = Surface.GRAFANA

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


TRAINING: tuple[Metric, ...] = (
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
        "entropy/sampler_gap",
        "nats",
        "A separate rollout engine's entropy (vLLM: its mean surprisal on its own samples) minus the "
        "trainer's H̄ on the same tokens; absent with HF generate, which samples with the trainer's own "
        "model and weights. The laws control the trainer's H̄.",
        shown=[_R],
    ),
    _m(
        "entropy/target",
        "nats",
        "The controller's target entropy, resolved: algorithm.control.target_entropy, nats or "
        "{relative: r} × H₀ (H₀: entropy/mean of the first RL step).",
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
)

# Holding a target as users see it (contract/stability.py), logged by every job with a target.
_TARGETED = "algorithms with a target entropy"
HOLDING: tuple[Metric, ...] = (
    _m(
        "entropy/ma_hold_fraction",
        "fraction",
        "Share of the steps from the settling step on whose 5-step moving average of entropy/mean is within "
        "±25 % of entropy/target (contract/stability.py).",
        prometheus="stare_job_entropy_ma_hold_fraction",
        prometheus_help="Share of post-settling steps with the 5-step mean within 25 % of the target.",
        shown=[Surface.REPORT],
        applies_to=_TARGETED,
    ),
    _m(
        "entropy/settling_step",
        "step",
        "The first RL step whose 5-step moving average of entropy/mean is within ±25 % of the target; 0 "
        "while none has been.",
        prometheus="stare_job_entropy_settling_step",
        shown=[Surface.REPORT],
        applies_to=_TARGETED,
    ),
    _m(
        "entropy/mean_abs_deviation",
        "fraction",
        "Mean of |entropy/mean − target| / target over the steps from the settling step on.",
        prometheus="stare_job_entropy_mean_abs_deviation",
        shown=[Surface.REPORT],
        applies_to=_TARGETED,
    ),
    _m(
        "entropy/ma_mean_abs_deviation",
        "fraction",
        "Mean of |M_t − target| / target over the steps from the settling step on, M_t the 5-step moving "
        "average of entropy/mean (what a chart of it shows; the sampler's step noise averaged down).",
        prometheus="stare_job_entropy_ma_mean_abs_deviation",
        shown=[Surface.REPORT],
        applies_to=_TARGETED,
    ),
    _m(
        "entropy/ma_max_excursion",
        "fraction",
        "The largest (M_t − target) / target from the settling step on: how far the moving average overshot "
        "above the target (≤ 0: it never went above).",
        prometheus="stare_job_entropy_ma_max_excursion",
        shown=[Surface.REPORT],
        applies_to=_TARGETED,
    ),
)
