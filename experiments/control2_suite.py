"""The second-generation entropy law's suite (docs/ALGORITHMS.md §12): the plant's step responses and the tuning
runs on the old tuning cell, then held-out cells no earlier suite used.

- ctl2-plant: the tuning cell's setting (SmolLM2, a+b 0..20, lr 2e-5, 4 × 8 samples at temperature 0.7),
  40 steps, the law open loop (a fixed output schedule, `algorithm.control.open_loop`): grpo_ds (u = 0),
  `up` (α = 0.3 throughout), `down` (κ = 0.6 throughout), `up_small` (α = 0.15 throughout),
  `small_then_down` (α = 0.15 for steps 1–20, then κ = 0.6), `down_p05` (κ = 0.6 with p_conf 0.5: at 0.95 the
  confident tokens' first-order entropy sensitivity is ~1 % of the batch's, §12.2). Seeds 0–1 (`up` seed 0 only: at α = 0.3 entropy
  rose from 0.9 to 5.2 nats in 40 steps and accuracy fell to 0). experiments/plant.py reads the gains and
  the lag off them.
- ctl2-tune: the tuning cell (target 0.7 × H₀), the law closed: `hold` and `floor` at the defaults, seeds
  0–2. Defaults may change after these runs; every held-out cell runs after they are committed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from experiments.smollm2 import base_spec
from experiments.suites import Run, Suite, merge

PLANT_STEPS = 40
RELATIVE = {"relative": 0.7}
SPLIT = "entropy_split"
# Open-loop schedules [from_step, u] with both spans at 1, so u is the actuator's value: α for u > 0, κ for u < 0.
PLANT_ARMS: dict[str, list[list[float]] | None] = {
    "grpo_ds": None,
    "up": [[1, 0.3]],
    "down": [[1, -0.6]],
    "up_small": [[1, 0.15]],
    "small_then_down": [[1, 0.15], [21, -0.6]],
    "down_p05": [[1, -0.6]],  # confident at p ≥ 0.5 (algorithm.params.p_conf), not 0.95
}
# The loss parameters an arm changes (the lowering actuator's confidence threshold).
ARM_PARAMS: dict[str, dict[str, Any]] = {"down_p05": {"p_conf": 0.5}}
CLOSED_ARMS: dict[str, dict[str, Any]] = {"hold": {"mode": "hold"}, "floor": {"mode": "floor"}}


def _smollm2(lr: float = 2e-5, steps: int = 100) -> dict[str, Any]:
    base = base_spec(lr, steps)
    base.pop("algorithm", None)
    return base


def _arm_algorithm(arm: str, target: Any, control: dict[str, Any] | None) -> dict[str, Any]:
    """An arm's algorithm section: grpo_ds with the cell's target where the page reads it (its gate section,
    which it does not act on), or the law with the cell's target (`floor`: its own default floor)."""
    if arm == "grpo_ds":
        return {"name": "grpo_ds", "gate": {"target_entropy": target}}
    params = ARM_PARAMS.get(arm, {})
    own = {} if (control or {}).get("mode") == "floor" else {"target_entropy": target}
    return {"name": SPLIT, "params": params, "control": {**own, **(control or {})}}


def _suite(name: str, title: str, base: dict[str, Any], arms: dict[str, Any], seeds: int) -> Suite:
    runs = []
    for seed in range(seeds):
        for arm, control in arms.items():
            spec = merge(base, {"name": f"{name}-{arm}-seed{seed}", "seed": seed})
            spec["algorithm"] = _arm_algorithm(arm, RELATIVE, control)
            runs.append(Run(name, f"{arm}/seed{seed}", spec, arm=arm, seed=seed, keep_checkpoints=False))
    description = f"{title} (experiments/control2_suite.py; docs/ALGORITHMS.md §12)."
    return Suite(name, title, description, tuple(runs), arms=tuple(arms), collapse_steps=5, warmup_steps=0,
                 stability=True)  # fmt: skip


def plant_suite() -> Suite:
    arms = {
        arm: None if sched is None else {"open_loop": sched, "span_up": 1.0, "span_down": 1.0}
        for arm, sched in PLANT_ARMS.items()
    }
    base = merge(_smollm2(steps=PLANT_STEPS), {"checkpoint": {"interval": PLANT_STEPS}})
    return _suite("ctl2-plant", "SmolLM2 a+b, lr 2e-5: the split law's actuators open loop", base, arms, 2)


def tune_suite() -> Suite:
    return _suite("ctl2-tune", "SmolLM2 a+b, lr 2e-5, target 0.7 × H₀ (tuning)", _smollm2(), CLOSED_ARMS, 3)


OPTIONAL: dict[str, Callable[[], Suite]] = {"ctl2-plant": plant_suite, "ctl2-tune": tune_suite}
