"""The metric catalogue's entries for the PI entropy laws and the holding statistics (contract/control.py,
contract/stability.py), kept in one block that contract.metrics appends to its catalogue.

Plain data (no import of contract.metrics): `entries(make, surfaces)` builds the entries with the
catalogue's own constructor and surfaces.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

LAWS = "entropy_pi, stare_pi, clip_pi"
# The keys the job view, the report and the CLI read (service/views.py control_status).
OUTPUT = "control/output"
ERROR = "control/error"
INTEGRAL = "control/integral"
SATURATED = "control/saturated"
SATURATED_STEPS = "control/saturated_steps"
ACTUATOR = "control/actuator"
TARGET = "control/target_entropy"
# Consecutive steps at the clip from which the target counts as not holdable with the actuator: the
# ControllerSaturated alert (deploy/prometheus/alerts.yml), the job view's and the report's `saturated`.
# At the raising clip (u = u_max > 0) 20 steps. At the lowering clip (u = −u_min) LOWERING_ALERT_STEPS: that
# side is small by design (u_min = 0.1) and leaves the lowering to the policy's own drift, so the law sits
# there on every approach from H₀ down to a target below it (21–27 steps on the tiny model, results/control);
# 50 steps there means the drift is not bringing entropy down either.
SATURATION_ALERT_STEPS = 20
LOWERING_ALERT_STEPS = 50


def saturation_alert(steps: float | None, output: float | None) -> bool:
    """Whether `steps` consecutive steps at the clip, with the law's output `output` (its sign says which
    clip; unknown: the raising side's count applies), mean the target cannot be held."""
    if steps is None:
        return False
    if output is not None and output < 0:
        return steps >= LOWERING_ALERT_STEPS
    return steps >= SATURATION_ALERT_STEPS


TARGETED = "algorithms with a target entropy"

# (key, unit, help, options): options name the Prometheus series, its help, the surfaces (by Surface
# value) and which algorithms emit it.
_ENTRIES: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    (
        "control/output",
        "output",
        "u, the PI law's clipped output this step (in [−u_min, u_max]; > 0 raises entropy, < 0 lowers it).",
        {"prometheus": "stare_job_control_output", "shown": ("job view", "report"), "applies_to": LAWS},
    ),
    (
        "control/error",
        "fraction",
        "e = (H* − H_s)/H*, the relative shortfall of the (smoothed) batch entropy from the target.",
        {"prometheus": "stare_job_control_error", "shown": ("job view", "report"), "applies_to": LAWS},
    ),
    (
        "control/integral",
        "fraction·steps",
        "I, the integrated error (not grown while the output sits at its clip in the error's direction).",
        {"prometheus": "stare_job_control_integral", "shown": ("job view", "report"), "applies_to": LAWS},
    ),
    (
        "control/saturated",
        "flag",
        "1 when the output sits at a clip (u = u_max or u = −u_min) this step.",
        {"shown": ("job view",), "applies_to": LAWS},
    ),
    (
        "control/saturated_steps",
        "steps",
        "Consecutive steps, up to this one, with the output at its clip; 20 or more at the raising clip, 50 "
        "or more at the lowering one: the target cannot be held with this actuator (alert "
        "ControllerSaturated).",
        {
            "prometheus": "stare_job_control_saturated_steps",
            "prometheus_help": "Consecutive steps with the PI law's output at its clip.",
            "shown": ("job view", "report"),
            "applies_to": LAWS,
        },
    ),
    (
        "control/actuator",
        "value",
        "What the output sets: the bonus coefficient α (entropy_pi), W (stare_pi) or ε_high (clip_pi).",
        {"prometheus": "stare_job_control_actuator", "shown": ("job view", "report"), "applies_to": LAWS},
    ),
    (
        "control/target_entropy",
        "nats",
        "H*, the PI law's target (algorithm.control.target_entropy, resolved).",
        {"shown": ("job view",), "applies_to": LAWS},
    ),
    (
        "entropy/ma_hold_fraction",
        "fraction",
        "Share of the steps from the settling step on whose 5-step moving average of entropy/mean is within "
        "±25 % of entropy/target (contract/stability.py).",
        {
            "prometheus": "stare_job_entropy_ma_hold_fraction",
            "prometheus_help": "Share of post-settling steps with the 5-step mean within 25 % of the target.",
            "shown": ("report",),
            "applies_to": TARGETED,
        },
    ),
    (
        "entropy/settling_step",
        "step",
        "The first RL step whose 5-step moving average of entropy/mean is within ±25 % of the target; 0 "
        "while none has been.",
        {"prometheus": "stare_job_entropy_settling_step", "shown": ("report",), "applies_to": TARGETED},
    ),
    (
        "entropy/mean_abs_deviation",
        "fraction",
        "Mean of |entropy/mean − target| / target over the steps from the settling step on.",
        {
            "prometheus": "stare_job_entropy_mean_abs_deviation",
            "shown": ("report",),
            "applies_to": TARGETED,
        },
    ),
)


def entries(make: Callable[..., Any], surfaces: Mapping[str, Any]) -> list[Any]:
    """The entries, each built by `make(key, unit, help, **options)` with surfaces looked up by value."""
    out = []
    for key, unit, help_text, options in _ENTRIES:
        opts = dict(options)
        opts["shown"] = [surfaces[s] for s in opts.get("shown", ())]
        out.append(make(key, unit, help_text, **opts))
    return out
