"""The dashboards, as data: the per-job dashboard, the fleet dashboard and the job comparison.

Every series a query reads is a Prometheus name from contract.metrics (the catalogue, FLEET_SERIES,
API_SERIES) or, for the GPU panels, DCGM-exporter's. `python -m monitoring --write` turns these into the
JSON under deploy/grafana/dashboards/ (monitoring/build.py).
"""

from __future__ import annotations

from contract import metrics as catalogue
from monitoring.model import RATE_INTERVAL, Dashboard, Expect, Panel, Query, Row, Variable

E = Expect

# The per-job selector: one job, of the chosen algorithm.
JOB = '{job_id="$job_id",algorithm=~"$algorithm"}'
# The comparison's selector: any number of jobs.
JOBS = '{job_id=~"$job_id"}'
QUEUE = '{queue=~"$queue"}'
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # DCGM-exporter's names (its default counters file)
GPU_FB_USED = "DCGM_FI_DEV_FB_USED"
GPU_FB_FREE = "DCGM_FI_DEV_FB_FREE"
DCGM_SERIES = (GPU_UTIL, GPU_FB_USED, GPU_FB_FREE)


def _name(key: str) -> str:
    name = catalogue.get(key).prometheus
    if name is None:
        raise ValueError(f"{key} has no Prometheus name")
    return name


def _q(key: str, legend: str, expect: Expect) -> Query:
    """A catalogued metric of the selected job."""
    return Query(f"{_name(key)}{JOB}", legend, expect)


def fleet_query(name: str, legend: str, expect: Expect) -> Query:
    """A per-job fleet series (FLEET_SERIES) of the selected job."""
    catalogue.fleet_series(name)  # refuses an unknown name
    return Query(f"{name}{JOB}", legend, expect)


_ALGORITHM = Variable("algorithm", "Algorithm", "label_values(stare_job_step, algorithm)", include_all=True)
_JOB_ID = Variable("job_id", "Job", 'label_values(stare_job_step{algorithm=~"$algorithm"}, job_id)')

JOB_DASHBOARD = Dashboard(
    uid="stare-job",
    title="STARE job",
    description="One training job: entropy against its band, the STARE gate, entropy dynamics, rewards, "
    "responses, the policy update, throughput and tool use.",
    variables=(_ALGORITHM, _JOB_ID),
    rows=(
        Row(
            "Entropy",
            (
                Panel(
                    "Entropy, band and target",
                    (
                        _q("entropy/mean", "entropy", E.POSITIVE),
                        _q("entropy/band_low", "band low", E.NONNEGATIVE),
                        _q("entropy/band_high", "band high", E.POSITIVE),
                        _q("stare/target_entropy", "STARE target", E.POSITIVE),
                        _q("entropy/target", "target (resolved)", E.POSITIVE),
                    ),
                    unit="nats",
                    width=12,
                    description="Token-mean entropy of π_old against the job's band and its controller's "
                    "target, resolved (a relative target is r × H₀ of the first RL step).",
                ),
                Panel(
                    "Band state",
                    (_q("entropy/band_state", "-1 below, 0 in, 1 above", E.STATE),),
                    width=6,
                ),
                Panel(
                    "Steps out of band",
                    (_q("entropy/steps_out_of_band", "consecutive steps", E.COUNT),),
                    width=6,
                ),
            ),
        ),
        Row(
            "Entropy stability",
            (
                Panel(
                    "Time to collapse",
                    (_q("entropy/collapse_step", "collapse step (0: none)", E.COUNT),),
                    width=8,
                    description="The first RL step from which entropy stayed below 0.25 × its first-step "
                    "value for 5 steps; 0 while it has not (contract/stability.py).",
                ),
                Panel(
                    "Held near the target",
                    (
                        _q("entropy/target_hold_fraction", "share within ±25 % of target", E.FRACTION),
                        _q("entropy/post_gate_steps", "post-gate steps", E.COUNT),
                    ),
                    width=16,
                    description="Share of the steps since entropy first went below the target (where "
                    "STARE's gate first acts) with entropy within ±25 % of the target.",
                ),
            ),
        ),
        Row(
            "Entropy controller (the laws)",
            (
                Panel(
                    "Held as users see it",
                    (
                        _q("entropy/ma_hold_fraction", "5-step mean within ±25 %", E.FRACTION),
                        _q("entropy/mean_abs_deviation", "mean |H − H*| / H*", E.NONNEGATIVE),
                        _q("entropy/settling_step", "settling step (0: not yet)", E.COUNT),
                        _q(
                            "entropy/ma_mean_abs_deviation", "mean |M − H*| / H* (5-step mean)", E.NONNEGATIVE
                        ),
                        _q("entropy/ma_max_excursion", "largest (M − H*) / H*", E.FINITE),
                    ),
                    width=24,
                    description="From the first step whose 5-step moving average M of entropy is within "
                    "±25 % of the target: the share of steps with M in that band, the mean relative deviation "
                    "of the per-step entropy and of M, and M's largest excursion above the target "
                    "(contract/stability.py).",
                ),
                Panel(
                    "Output, error and integral",
                    (
                        _q("control/output", "output u", E.FINITE),
                        _q("control/error", "error e (relative)", E.FINITE),
                        _q("control/integral", "integral I", E.FINITE),
                    ),
                    width=12,
                    description="The PI law of entropy_pi, stare_pi and clip_pi: e = (H* − H)/H*, "
                    "u = clip(Kp·e + Ki·I, −u_min, u_max); u > 0 raises entropy (docs/ALGORITHMS.md §11).",
                ),
                Panel(
                    "Actuator and saturation",
                    (
                        _q("control/actuator", "actuator (α, W or ε_high)", E.FINITE),
                        _q("control/saturated_steps", "consecutive steps at the clip", E.COUNT),
                    ),
                    width=12,
                    description="What the output sets, and how long it has sat at its clip: 20 steps or "
                    "more at the raising clip, 50 or more at the lowering one, fire ControllerSaturated (the "
                    "target cannot be held with this actuator).",
                ),
            ),
            requires="a PI entropy law",
        ),
        Row(
            "STARE gate",
            (
                Panel("Gate on/off", (_q("stare/gate_on", "gate", E.FLAG),), width=8),
                Panel(
                    "Weights W and M",
                    (
                        _q("stare/reweight_w", "W", E.POSITIVE),
                        _q("stare/reweight_m", "M", E.NONNEGATIVE),
                        _q("stare/mean_weight", "mean token weight", E.POSITIVE),
                    ),
                    width=16,
                ),
            ),
        ),
        Row(
            "Entropy dynamics",
            (
                Panel(
                    "Quadrant token shares",
                    tuple(
                        _q(f"quadrant/{name}_fraction", label, E.FRACTION)
                        for name, label in (
                            ("pos_low", "Â>0, s<H"),
                            ("pos_high", "Â>0, s>H"),
                            ("neg_low", "Â<0, s<H"),
                            ("neg_high", "Â<0, s>H"),
                        )
                    ),
                    unit="percentunit",
                    width=12,
                ),
                Panel(
                    "Predicted entropy drift",
                    (
                        _q("quadrant/predicted_drift", "total", E.FINITE),
                        *(
                            _q(f"quadrant/{name}_drift", name, E.FINITE)
                            for name in ("pos_low", "pos_high", "neg_low", "neg_high")
                        ),
                    ),
                    width=12,
                    description="First-order entropy change of the update, total and by quadrant.",
                ),
            ),
        ),
        Row(
            "Reward and accuracy",
            (
                Panel(
                    "Reward and accuracy",
                    (_q("reward/mean", "reward", E.FINITE), _q("reward/accuracy", "accuracy", E.FRACTION)),
                    width=12,
                ),
                Panel(
                    "Held-out avg@k and pass@k",
                    (_q("eval/avg@k", "avg@k", E.FRACTION), _q("eval/pass@k", "pass@k", E.FRACTION)),
                    unit="percentunit",
                    width=12,
                    description="The job's latest evaluation on its held-out prompts.",
                ),
            ),
        ),
        Row(
            "Responses",
            (
                Panel("Response length", (_q("response/length_mean", "mean", E.POSITIVE),), width=12),
                Panel(
                    "Truncated fraction and reflection rate",
                    (
                        _q("response/truncated_fraction", "truncated", E.FRACTION),
                        _q("response/reflection_rate", "reflections per response", E.NONNEGATIVE),
                    ),
                    width=12,
                ),
            ),
        ),
        Row(
            "Policy update",
            (
                Panel(
                    "Clip fractions",
                    (
                        _q("clip/fraction", "clipped", E.FRACTION),
                        _q("clip/low_fraction", "low", E.FRACTION),
                        _q("clip/high_fraction", "high", E.FRACTION),
                        _q("clip/dual_fraction", "dual", E.FRACTION),
                    ),
                    unit="percentunit",
                    width=6,
                ),
                Panel("KL to the behaviour policy", (_q("kl/approx_old", "approx KL", E.FINITE),), width=6),
                Panel("Gradient norm", (_q("actor/grad_norm", "before clipping", E.NONNEGATIVE),), width=6),
                Panel(
                    "Zero-variance groups",
                    (_q("reward/zero_std_fraction", "equal-reward groups", E.FRACTION),),
                    unit="percentunit",
                    width=6,
                ),
            ),
        ),
        Row(
            "Throughput and health",
            (
                Panel("Tokens per second", (_q("perf/tokens_per_second", "tokens/s", E.POSITIVE),), width=6),
                Panel("Step seconds", (_q("perf/step_seconds", "step", E.POSITIVE),), unit="s", width=6),
                Panel(
                    "Heartbeat age",
                    (
                        fleet_query(
                            "stare_job_heartbeat_age_seconds", "since the lease was renewed", E.NONNEGATIVE
                        ),
                    ),
                    unit="s",
                    width=6,
                ),
                Panel(
                    "Step",
                    (
                        fleet_query("stare_job_step", "step", E.STEP),
                        fleet_query("stare_job_total_steps", "of", E.POSITIVE),
                    ),
                    kind="stat",
                    width=6,
                ),
            ),
        ),
        Row(
            "Rollout engine",
            (
                Panel(
                    "Sampler-trainer log-prob mismatch",
                    (
                        _q("rollout/mismatch_abs_mean", "mean |Δ log p|", E.NONNEGATIVE),
                        _q("rollout/mismatch_abs_max", "max |Δ log p|", E.NONNEGATIVE),
                        _q("rollout/mismatch_kl", "KL (k3)", E.NONNEGATIVE),
                    ),
                    width=12,
                    description="vLLM's log-probs of the sampled tokens against the trainer's, each step.",
                ),
                Panel(
                    "Truncated IS weight",
                    (_q("rollout/tis_weight_mean", "mean weight", E.NONNEGATIVE),),
                    width=12,
                ),
            ),
            requires="rollout.engine vllm",
        ),
        Row(
            "Tool use",
            (
                Panel(
                    "Tool calls and turns",
                    (
                        _q("tool/calls_per_response", "calls per response", E.NONNEGATIVE),
                        _q("tool/turns_per_episode", "turns per episode", E.POSITIVE),
                    ),
                    width=6,
                ),
                Panel(
                    "Tool error and timeout rates",
                    (
                        _q("tool/error_rate", "errors", E.FRACTION),
                        _q("tool/timeout_rate", "timeouts", E.FRACTION),
                    ),
                    unit="percentunit",
                    width=6,
                ),
                Panel(
                    "Tool-output token share",
                    (_q("tool/output_token_fraction", "tool output", E.FRACTION),),
                    unit="percentunit",
                    width=6,
                ),
                Panel(
                    "Token mismatches",
                    (_q("tool/token_mismatches", "must be 0", E.ZERO),),
                    width=6,
                    description="Tokens whose ids differ between what the model saw and what is trained.",
                ),
            ),
            requires="tool-use",
        ),
        Row(
            "Grader",
            (
                Panel(
                    "Grader failures",
                    (
                        _q("grader/errors", "failed samples", E.COUNT),
                        _q("grader/timeouts", "timeouts", E.COUNT),
                        _q("grader/non_finite", "non-finite", E.COUNT),
                    ),
                    width=6,
                    description="Samples whose grading failed in the step; past grading.max_error_rate of "
                    "the error window the job ends grader_failed (docs/GRADERS.md).",
                ),
                Panel(
                    "Grader error rates",
                    (
                        _q("grader/error_rate", "this step", E.FRACTION),
                        _q("grader/window_error_rate", "error window", E.FRACTION),
                    ),
                    unit="percentunit",
                    width=6,
                ),
                Panel(
                    "Grader scores",
                    (
                        _q("grader/score_mean", "mean", E.FINITE),
                        _q("grader/score_std", "spread", E.NONNEGATIVE),
                        _q("grader/all_equal_groups", "all-equal groups", E.FRACTION),
                    ),
                    width=6,
                ),
                Panel(
                    "Grading time",
                    (
                        _q("grader/seconds", "seconds", E.NONNEGATIVE),
                        _q("grader/step_share", "share of the step", E.FRACTION),
                    ),
                    width=6,
                ),
            ),
            requires="a grader",
        ),
    ),
)

_QUEUE = Variable("queue", "Queue", "label_values(stare_workers_busy, queue)", multi=True, include_all=True)


def _rate(name: str) -> str:
    return f"rate({name}[{RATE_INTERVAL}])"


FLEET_DASHBOARD = Dashboard(
    uid="stare-fleet",
    title="STARE fleet",
    description="The training fleet: queues, workers, jobs by state and failure, heartbeats, the API's "
    "requests and the GPUs.",
    variables=(_QUEUE,),
    rows=(
        Row(
            "Queues and workers",
            (
                Panel(
                    "Queue depth",
                    (Query(f"sum by (queue) (stare_queue_messages{QUEUE})", "{{queue}}", E.COUNT),),
                    width=8,
                ),
                Panel(
                    "Workers busy and idle",
                    (
                        Query(f"sum by (queue) (stare_workers_busy{QUEUE})", "busy {{queue}}", E.COUNT),
                        Query(f"sum by (queue) (stare_workers_idle{QUEUE})", "idle {{queue}}", E.COUNT),
                        Query(f"sum by (queue) (stare_workers{QUEUE})", "all {{queue}}", E.POSITIVE),
                    ),
                    width=8,
                ),
                Panel(
                    "Active jobs' progress",
                    (
                        Query(
                            f"stare_job_step{QUEUE} / stare_job_total_steps{QUEUE}",
                            "{{algorithm}} {{job_id}}",
                            E.FRACTION,
                        ),
                    ),
                    unit="percentunit",
                    width=8,
                ),
            ),
        ),
        Row(
            "Jobs",
            (
                Panel(
                    "Jobs by state",
                    (Query(f"sum by (status) (stare_jobs{QUEUE})", "{{status}}", E.COUNT),),
                    width=6,
                ),
                Panel(
                    "Jobs no live worker can take",
                    (Query(f"sum by (queue) (stare_jobs_without_worker{QUEUE})", "{{queue}}", E.ZERO),),
                    width=6,
                    description="Queued or recovering jobs in a queue that no live worker serves (alert "
                    "JobsWithoutWorker). Start a worker of that queue; a worker without bubblewrap refuses to start.",
                ),
                Panel(
                    "Failures by code",
                    (Query(f"sum by (code) (stare_failed_jobs{QUEUE})", "{{code}}", E.COUNT),),
                    width=6,
                ),
                Panel(
                    "Heartbeat ages",
                    (Query(f"stare_job_heartbeat_age_seconds{QUEUE}", "{{job_id}}", E.NONNEGATIVE),),
                    unit="s",
                    width=6,
                ),
            ),
        ),
        Row(
            "API",
            (
                Panel(
                    "Request rate by route",
                    (
                        Query(
                            f"sum by (route, method) ({_rate('stare_http_requests_total')})",
                            "{{method}} {{route}}",
                            E.NONNEGATIVE,
                        ),
                    ),
                    unit="reqps",
                    width=8,
                ),
                Panel(
                    "Request rate by status class",
                    (
                        Query(
                            f"sum by (status_class) ({_rate('stare_http_requests_total')})",
                            "{{status_class}}",
                            E.NONNEGATIVE,
                        ),
                    ),
                    unit="reqps",
                    width=8,
                ),
                Panel(
                    "Latency p95 by route",
                    (
                        Query(
                            "histogram_quantile(0.95, sum by (route, le) "
                            f"({_rate('stare_http_request_duration_seconds_bucket')})) "
                            f"and sum by (route) ({_rate('stare_http_request_duration_seconds_count')}) > 0",
                            "{{route}}",
                            E.POSITIVE,
                        ),
                    ),
                    unit="s",
                    width=8,
                    description="Routes that served a request in the window.",
                ),
            ),
        ),
        Row(
            "Health",
            (
                Panel(
                    "Exporter and database up",
                    (
                        Query("stare_fleet_scrape_ok", "exporter read the database", E.FLAG),
                        Query("stare_database_up", "API read the database", E.FLAG),
                    ),
                    width=8,
                ),
                Panel(
                    "Enqueue failures",
                    (
                        Query(
                            f"sum ({_rate('stare_enqueue_failures_total')})", "doorbells lost", E.NONNEGATIVE
                        ),
                    ),
                    width=8,
                ),
            ),
        ),
        Row(
            "GPUs (DCGM-exporter)",
            (
                Panel(
                    "GPU utilisation",
                    (Query(f"avg by (Hostname, gpu) ({GPU_UTIL})", "{{Hostname}} GPU {{gpu}}", E.STATIC),),
                    unit="percent",
                    width=12,
                ),
                Panel(
                    "GPU memory",
                    (
                        Query(
                            f"sum by (Hostname, gpu) ({GPU_FB_USED})", "used {{Hostname}} {{gpu}}", E.STATIC
                        ),
                        Query(
                            f"sum by (Hostname, gpu) ({GPU_FB_USED}) / "
                            f"(sum by (Hostname, gpu) ({GPU_FB_USED}) + sum by (Hostname, gpu) ({GPU_FB_FREE}))",
                            "share {{Hostname}} {{gpu}}",
                            E.STATIC,
                        ),
                    ),
                    unit="decmbytes",
                    width=12,
                    description="Frame-buffer memory used (MiB) and its share of the GPU's memory.",
                ),
            ),
            requires="gpu",
        ),
    ),
)

_JOB_IDS = Variable(
    "job_id", "Jobs", 'label_values(stare_job_step{algorithm=~"$algorithm"}, job_id)', multi=True
)
_ALGORITHMS = Variable(
    "algorithm", "Algorithms", "label_values(stare_job_step, algorithm)", multi=True, include_all=True
)


def _each(key: str, expect: Expect) -> Query:
    return Query(f"{_name(key)}{JOBS}", "{{algorithm}} {{job_id}}", expect)


COMPARE_DASHBOARD = Dashboard(
    uid="stare-compare",
    title="STARE job comparison",
    description="Two or more jobs on shared axes (e.g. grpo_ds against stare on the same task): pick them in "
    "the Jobs variable.",
    variables=(_ALGORITHMS, _JOB_IDS),
    rows=(
        Row(
            "Entropy",
            (
                Panel("Entropy by job", (_each("entropy/mean", E.POSITIVE),), unit="nats", width=12),
                Panel("Steps out of band by job", (_each("entropy/steps_out_of_band", E.COUNT),), width=12),
            ),
        ),
        Row(
            "Accuracy",
            (
                Panel(
                    "Accuracy by job", (_each("reward/accuracy", E.FRACTION),), unit="percentunit", width=12
                ),
                Panel(
                    "Held-out avg@k by job", (_each("eval/avg@k", E.FRACTION),), unit="percentunit", width=12
                ),
            ),
        ),
    ),
)

DASHBOARDS: tuple[Dashboard, ...] = (JOB_DASHBOARD, FLEET_DASHBOARD, COMPARE_DASHBOARD)
