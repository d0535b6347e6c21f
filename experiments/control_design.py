"""The entropy laws on the simulated plant (experiments/plant_model.py; docs/ALGORITHMS.md §12.2–12.4): the
first-generation default law (`entropy_pi`) against `entropy_split` at its first and at its committed
defaults, on the tuning plant and on plants whose gains, lag, drift and noise are moved away from it (the
held-out cells differ from the tuning cell in all of them). Per plant and law, over `seeds` simulated runs of `steps` steps at the target 0.7 × H₀,
the holding statistics users see (contract/stability.py: settling step, the 5-step moving average's share in
±25 %, its mean deviation and largest excursion above the target) and the overshoot cycle's signature: the
share of post-settling steps with the moving average above the band against below it.

Usage: python -m experiments.control_design [--seeds 40] [--steps 100] [--grid | --spread | --family]
(--grid: the search the committed defaults came from, `--grid --seeds 20` about 2 min on one core; --spread:
what one run of the committed law can show at the noise the runs measured, `--spread --seeds 200`; --family:
the best that a law of the same shape can show there, `--family --seeds 40` about 3 min.)
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contract import control
from contract.control.split import FIRST_DEFAULTS
from contract.stability import HOLD_TOLERANCE, holding, moving_average
from experiments.plant_model import Plant, Trace, run

RELATIVE_TARGET = 0.7
# The tuning plant (the tuning cell, SmolLM2 a+b at lr 2e-5; §12.2) and its neighbours.
TUNING = Plant()
PLANTS: dict[str, Plant] = {
    "tuning": TUNING,
    "weak raise (b_up × 0.4)": TUNING.scaled(b_up=TUNING.b_up * 0.4),
    "strong raise (b_up × 2), long lag": TUNING.scaled(b_up=TUNING.b_up * 2.0, momentum=0.85),
    "weak lowering (b_down × 0.4)": TUNING.scaled(b_down=TUNING.b_down * 0.4),
    "fast drift (× 2)": TUNING.scaled(drift=TUNING.drift * 2.0, accel=TUNING.accel * 2.0),
    "noisy (× 1.5)": TUNING.scaled(
        process_noise=TUNING.process_noise * 1.5, measurement_noise=TUNING.measurement_noise * 1.5
    ),
}
# The first-generation law's lowering side was a negative bonus, which lowers entropy about 2.0 per unit α
# (the first design's crash, §11.3): the simulation gives it that gain on the lowering side.
PI_LOWERING_GAIN = 2.0

Law = Callable[[Any, float], tuple[Any, float, float]]


def law(name: str, target: float, plant: Plant, **settings: Any) -> tuple[Law, Any]:
    """(the law as the plant drives it: (state, H̄) → (state, α, κ), its initial state)."""
    bound = control.bind(name, target_entropy=target, **settings)
    if name == "entropy_split":

        def split(state: Any, h: float) -> tuple[Any, float, float]:
            state = bound.update(state, h)
            return state, state.bonus, state.sharpen

        return split, bound.initial_state()

    def pi(state: Any, h: float) -> tuple[Any, float, float]:
        state = bound.update(state, h)
        alpha = float(state.actuator)
        return state, max(alpha, 0.0), max(-alpha, 0.0) * PI_LOWERING_GAIN / plant.b_down

    return pi, bound.initial_state()


@dataclass(frozen=True)
class Holding:
    settled: bool
    settling_step: int | None
    ma_share: float
    ma_deviation: float
    excursion: float
    above: float  # share of post-settling steps with the moving average above the band
    below: float


def judge(trace: Trace, target: float) -> Holding:
    held = holding(list(enumerate(trace.measured, 1)), target)
    if held.settling_step is None:
        return Holding(False, None, 0.0, math.inf, math.inf, 0.0, 0.0)
    ma = [m for m in moving_average(trace.measured)[held.settling_step - 1 :] if m is not None]
    above = sum(m > (1 + HOLD_TOLERANCE) * target for m in ma) / len(ma)
    below = sum(m < (1 - HOLD_TOLERANCE) * target for m in ma) / len(ma)
    return Holding(
        True,
        held.settling_step,
        held.ma_hold_fraction or 0.0,
        held.ma_mean_abs_deviation or 0.0,
        held.ma_max_excursion or 0.0,
        above,
        below,
    )


def evaluate(name: str, plant: Plant, *, seeds: int, steps: int, **settings: Any) -> list[Holding]:
    target = RELATIVE_TARGET * plant.h0
    out = []
    for seed in range(seeds):
        step, state = law(name, target, plant, **settings)
        out.append(judge(run(plant, step, state, steps=steps, seed=seed), target))
    return out


def summary(rows: list[Holding]) -> dict[str, float]:
    settled = [r for r in rows if r.settled]
    if not settled:
        return {"settled": 0.0}
    return {
        "settled": len(settled) / len(rows),
        "settling_max": float(max(r.settling_step or 0 for r in settled)),
        "ma_share": statistics.fmean(r.ma_share for r in settled),
        "ma_share_min": min(r.ma_share for r in settled),
        "ma_deviation": statistics.fmean(r.ma_deviation for r in settled),
        "excursion": statistics.fmean(r.excursion for r in settled),
        "excursion_max": max(r.excursion for r in settled),
        "above": statistics.fmean(r.above for r in settled),
        "below": statistics.fmean(r.below for r in settled),
    }


# The rows: the first-generation law, entropy_split at its first defaults (the first held-out round) and at
# its committed defaults.
LAWS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("entropy_pi", "entropy_pi", {}),
    ("entropy_split, first defaults", "entropy_split", dict(FIRST_DEFAULTS)),
    ("entropy_split", "entropy_split", {}),
)


# The search the committed defaults came from (docs/ALGORITHMS.md §12.4): every combination, on every plant.
GRID: dict[str, tuple[float, ...]] = {
    "kp": (1.0, 1.5, 2.0, 2.5, 3.0),
    "ki": (0.02, 0.05, 0.1),
    "filter": (0.1, 0.3),
    "rate": (0.35, 0.7),
}


def grid(seeds: int, steps: int) -> list[tuple[float, dict[str, float], list[dict[str, float]]]]:
    """(mean over the plants of the moving average's mean deviation, settings, per-plant summaries) for every
    combination of GRID, best first; a plant where a seed never settles counts as deviation 1."""
    out = []
    for values in itertools.product(*GRID.values()):
        settings = dict(zip(GRID, values, strict=True))
        per = [
            summary(evaluate("entropy_split", plant, seeds=seeds, steps=steps, **settings))
            for plant in PLANTS.values()
        ]
        score = statistics.fmean(p["ma_deviation"] if p["settled"] == 1.0 else 1.0 for p in per)
        out.append((score, settings, per))
    return sorted(out, key=lambda row: row[0])


def print_grid(seeds: int, steps: int, top: int = 12) -> None:
    print("| mean MA deviation | kp | ki | filter | rate | " + " | ".join(PLANTS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(PLANTS))
    rows = grid(seeds, steps)
    first = next(r for r in rows if all(r[1][k] == v for k, v in FIRST_DEFAULTS.items()))
    for score, settings, per in [*rows[:top], first]:
        cells = " | ".join(f"{p.get('ma_deviation', 1.0):.3f} ({p.get('ma_share', 0.0):.2f})" for p in per)
        print(f"| {score:.3f} | " + " | ".join(f"{settings[k]:g}" for k in GRID) + f" | {cells} |")


def split_noise(step_1x: float, step_kx: float, k: float = 4.0) -> tuple[float, float]:
    """(σ_v, σ_w): the sensor's and the plant's own noise from the step noise s = √(σ_v² + σ_w²/2) of one cell
    at 1 × and k × the samples per step (contract.stability.step_noise: the successive differences hold the
    sensor noise twice and the plant's once), sampling noise falling as 1/√k: σ_v² (1 − 1/k) = s₁² − s_k²."""
    sensor = (step_1x**2 - step_kx**2) / (1.0 - 1.0 / k)
    if sensor <= 0 or step_1x**2 - sensor <= 0:
        raise ValueError(f"step noise {step_1x} at 1 × and {step_kx} at {k:g} × admit no split")
    return math.sqrt(sensor), math.sqrt(2.0 * (step_1x**2 - sensor))


# The second round's temperature-1.0 cell, seed 0 (docs/ALGORITHMS.md §12.5): step noise 0.185 of the target at
# 4 × 8 samples, 0.109 at 16 × 8: σ_v = 0.173 (0.086 at 16 × 8) and σ_w = 0.094, an upper bound on the plant's
# own noise (it holds the law's moves too). The tuning plant with those noises in place of its own.
SENSOR_NOISE, PROCESS_NOISE = split_noise(0.185, 0.109)
MEASURED_NOISE: dict[str, Plant] = {
    "measured noise, 4 × 8 samples": TUNING.scaled(
        measurement_noise=SENSOR_NOISE, process_noise=PROCESS_NOISE
    ),
    "measured noise, 16 × 8 samples": TUNING.scaled(
        measurement_noise=SENSOR_NOISE / 2.0, process_noise=PROCESS_NOISE
    ),
}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def spread(plant: Plant, seeds: int, steps: int, **settings: Any) -> dict[str, float]:
    """What one run can show: the committed law's per-seed holding figures over `seeds` simulated runs (mean,
    sd, 10th and 90th percentiles of the deviation) and the share of seeds inside each of the issue's bounds."""
    rows = [r for r in evaluate("entropy_split", plant, seeds=seeds, steps=steps, **settings) if r.settled]
    deviation = [r.ma_deviation for r in rows]
    return {
        "settled": len(rows) / seeds,
        "deviation": statistics.fmean(deviation),
        "deviation_sd": statistics.stdev(deviation),
        "deviation_p10": quantile(deviation, 0.1),
        "deviation_p90": quantile(deviation, 0.9),
        "within_deviation": sum(d <= 0.08 for d in deviation) / len(rows),
        "within_share": sum(r.ma_share >= 0.95 for r in rows) / len(rows),
        "within_excursion": sum(r.excursion <= 0.25 for r in rows) / len(rows),
        "within_all": sum(r.ma_deviation <= 0.08 and r.ma_share >= 0.95 and r.excursion <= 0.25 for r in rows)
        / len(rows),
    }


def print_spread(seeds: int, steps: int) -> None:
    print(
        "| plant | MA deviation: mean ± sd (p10–p90) | seeds with deviation ≤ 0.08 | in band ≥ 95 % "
        "| excursion ≤ 25 % | all three |"
    )
    print("|---|---|---|---|---|---|")
    for name, plant in {"tuning": TUNING, **MEASURED_NOISE}.items():
        s = spread(plant, seeds, steps)
        print(
            f"| {name} | {s['deviation']:.3f} ± {s['deviation_sd']:.3f} ({s['deviation_p10']:.3f}–"
            f"{s['deviation_p90']:.3f}) | {s['within_deviation']:.2f} | {s['within_share']:.2f} "
            f"| {s['within_excursion']:.2f} | {s['within_all']:.2f} |"
        )


# The law family searched for the best a run can show at the measured noise: wider than GRID (no filter, no
# effective rate limit at 2, gains to 4).
FAMILY: dict[str, tuple[float, ...]] = {
    "kp": (1.0, 2.0, 3.0, 4.0),
    "ki": (0.02, 0.05, 0.1, 0.2),
    "filter": (0.0, 0.1, 0.3, 0.5),
    "rate": (0.35, 0.7, 2.0),
}


def best_of_family(plant: Plant, seeds: int, steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """(settings, spread) of the FAMILY member whose runs most often meet all three bounds (then the lowest
    mean deviation)."""
    rows = []
    for values in itertools.product(*FAMILY.values()):
        settings = dict(zip(FAMILY, values, strict=True))
        rows.append((settings, spread(plant, seeds, steps, **settings)))
    return min(rows, key=lambda row: (-row[1]["within_all"], row[1]["deviation"]))


def print_family(seeds: int, steps: int) -> None:
    for name, plant in MEASURED_NOISE.items():
        settings, s = best_of_family(plant, seeds, steps)
        size = math.prod(len(v) for v in FAMILY.values())
        print(
            f"{name}: the best of {size} laws ({', '.join(f'{k} {v:g}' for k, v in settings.items())}) meets all "
            f"three bounds on {s['within_all']:.3f} of the seeds, deviation {s['deviation']:.3f} ± "
            f"{s['deviation_sd']:.3f}, in band ≥ 95 % on {s['within_share']:.3f}, excursion ≤ 25 % on "
            f"{s['within_excursion']:.3f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.control_design", description=__doc__)
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--grid", action="store_true", help="the search over GRID instead (ranked)")
    parser.add_argument(
        "--spread", action="store_true", help="the committed law's per-seed spread at the measured noise"
    )
    parser.add_argument("--family", action="store_true", help="the best law of FAMILY at the measured noise")
    args = parser.parse_args(argv)
    if args.grid:
        print_grid(args.seeds, args.steps)
        return 0
    if args.spread:
        print_spread(args.seeds, args.steps)
        return 0
    if args.family:
        print_family(args.seeds, args.steps)
        return 0
    print(
        "| plant | law | settled (last step) | MA in ±25 % (min) | MA deviation | excursion (max) | above / below |"
    )
    print("|---|---|---|---|---|---|---|")
    for plant_name, plant in PLANTS.items():
        for label, name, settings in LAWS:
            s = summary(evaluate(name, plant, seeds=args.seeds, steps=args.steps, **settings))
            print(
                f"| {plant_name} | {label} | {s['settled']:.2f} ({s.get('settling_max', 0):.0f}) "
                f"| {s.get('ma_share', 0):.2f} ({s.get('ma_share_min', 0):.2f}) | {s.get('ma_deviation', 0):.3f} "
                f"| {s.get('excursion', 0):.2f} ({s.get('excursion_max', 0):.2f}) "
                f"| {s.get('above', 0):.2f} / {s.get('below', 0):.2f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
