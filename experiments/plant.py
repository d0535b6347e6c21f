"""The entropy plant, measured on finished runs: the drift per step and each actuator's gain, from which the
PI laws' default gains are derived (docs/ALGORITHMS.md §11, `contract.control`).

The model, per RL step k, in relative units (x = H̄ / H*):

    ln H̄_{k+1} − ln H̄_k = −δ + β·a_k + noise

δ is the relative drift per step without control (grpo_ds); a_k is the actuator's value applied at step k
(the entropy bonus's coefficient α, `entropy_bonus/coef`; STARE's W − 1 while its gate is on) and β its
gain per unit of a. Both are read from the runs' events only:

- δ: the mean of −Δ ln H̄ over the window of grpo_ds steps, pooled over seeds;
- σ: sd(Δ ln H̄)/√2 of grpo_ds over the window, the relative noise of one measurement (an upper bound: the
  drift's own variation counts in it);
- β: per seed, (mean Δ ln H̄ of the method − mean Δ ln H̄ of grpo_ds) / mean a, over the same window,
  averaged over the seeds both have (paired by seed: same data order, same first steps).

The window is steps [first, last] (default 3–40: after the first steps' fast fall, before entropy reaches the
floor where ln H̄ is mostly noise); steps whose H̄ is below `floor` nats on either side are skipped.

Usage: python -m experiments.plant RUNS_DIR [--first 3 --last 40 --floor 0.02]
RUNS_DIR holds one folder per learning rate, each with METHOD/seedN/ run folders (the SmolLM2 suite's
layout, events plain or compressed: experiments/rundata.py); it is an argument because the run data may
move.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from experiments.rundata import events_path, read_events

ENTROPY = "entropy/mean"
BONUS = "entropy_bonus/coef"
GATE_ON = "stare/gate_on"
WEIGHT_W = "stare/reweight_w"
BASELINE = "grpo_ds"
# method folder → how its actuator's value a_k is read from a step's metrics
ACTUATORS = {
    "adaptive_entropy": "bonus",
    "stare_o1": "stare_w",
    "stare_w4": "stare_w",
}


@dataclass(frozen=True)
class Estimate:
    name: str
    value: float
    spread: float  # standard deviation over seeds (0 with one seed)
    seeds: int


def read_steps(folder: Path) -> list[dict[str, float]]:
    """The step events' metrics of one run (its folder, read through experiments/rundata.py), in step order."""
    rows = [(int(e["step"]), e["metrics"]) for e in read_events(folder) if e.get("type") == "step"]
    return [m for _s, m in sorted(rows, key=lambda r: r[0])]


def actuator_value(metrics: dict[str, float], kind: str) -> float:
    if kind == "bonus":
        return float(metrics.get(BONUS, 0.0))
    return float(metrics.get(GATE_ON, 0.0)) * (float(metrics.get(WEIGHT_W, 1.0)) - 1.0)


def log_steps(
    steps: Sequence[dict[str, float]], first: int, last: int, floor: float, kind: str | None
) -> tuple[list[float], list[float]]:
    """(Δ ln H̄_k, a_k) for k in [first, last] where both H̄_k and H̄_{k+1} are at least `floor`."""
    deltas, values = [], []
    for k in range(first, min(last, len(steps) - 2) + 1):
        h0, h1 = float(steps[k][ENTROPY]), float(steps[k + 1][ENTROPY])
        if h0 < floor or h1 < floor:
            continue
        deltas.append(math.log(h1) - math.log(h0))
        values.append(0.0 if kind is None else actuator_value(steps[k], kind))
    return deltas, values


def _seeds(folder: Path) -> dict[str, Path]:
    """seedN → its run folder, for the seeds that have events."""
    return {p.name: p for p in sorted(folder.glob("seed*")) if events_path(p) is not None}


def _estimate(name: str, values: Sequence[float]) -> Estimate:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return Estimate(name, statistics.fmean(values), spread, len(values))


def estimate_lr(folder: Path, *, first: int = 3, last: int = 40, floor: float = 0.02) -> list[Estimate]:
    """δ from grpo_ds and β of every actuator with runs in `folder` (one learning rate)."""
    base = {
        seed: log_steps(read_steps(p), first, last, floor, None)[0]
        for seed, p in _seeds(folder / BASELINE).items()
    }
    base = {seed: d for seed, d in base.items() if d}
    if not base:
        raise ValueError(f"{folder}: no {BASELINE} run with steps in the window")
    out = [_estimate("drift δ (per step)", [-statistics.fmean(d) for d in base.values()])]
    # The step-to-step spread of ln H̄ around the drift, as a per-measurement noise: sd(Δ ln H̄)/√2.
    noisy = [statistics.stdev(d) / math.sqrt(2) for d in base.values() if len(d) > 1]
    if noisy:
        out.append(_estimate("step-to-step spread σ (relative; bounds the measurement noise)", noisy))
    for method, kind in ACTUATORS.items():
        gains = []
        for seed, path in _seeds(folder / method).items():
            deltas, values = log_steps(read_steps(path), first, last, floor, kind)
            if seed not in base or not deltas or statistics.fmean(values) <= 0:
                continue
            gains.append((statistics.fmean(deltas) - statistics.fmean(base[seed])) / statistics.fmean(values))
        if gains:
            unit = "coefficient" if kind == "bonus" else "unit of W − 1"
            out.append(_estimate(f"gain β of {method} (per {unit})", gains))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.plant", description=__doc__.split("\n")[0])
    parser.add_argument("runs", type=Path, help="folder of per-learning-rate run folders (METHOD/seedN/)")
    parser.add_argument("--first", type=int, default=3)
    parser.add_argument("--last", type=int, default=40)
    parser.add_argument("--floor", type=float, default=0.02)
    args = parser.parse_args(argv)
    folders = sorted(p for p in args.runs.iterdir() if (p / BASELINE).is_dir())
    if not folders:
        print(f"{args.runs}: no folder with a {BASELINE}/ run", file=sys.stderr)
        return 2
    for folder in folders:
        print(f"## {folder.name} (steps {args.first}–{args.last}, H̄ ≥ {args.floor} nats)")
        for est in estimate_lr(folder, first=args.first, last=args.last, floor=args.floor):
            print(f"- {est.name}: {est.value:+.4f} ± {est.spread:.4f} (sd over {est.seeds} seeds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
