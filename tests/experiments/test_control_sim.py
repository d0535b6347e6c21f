"""experiments/control_sim.py: the designs' comparison on the simulated plant (docs/ALGORITHMS.md §11.3)."""

from __future__ import annotations

from experiments.control_sim import Design, compare, simulate


def test_the_lowering_clip_bounds_the_first_steps_sharpening() -> None:
    # H₀ is 1/0.7 × the target: the first error is −0.43. With u ≥ −0.1 the first step lowers ln H by at
    # most the drift + 2.0 × 0.055 (+ noise); with u ≥ −1 by up to 2.0 × 0.55: a crash of the first steps.
    clipped = [simulate(Design(0.8, 0.1), 0.0575, 0.57, 0.0, s)[1] for s in range(5)]
    symmetric = [simulate(Design(0.8, 1.0), 0.0575, 0.57, 0.0, s)[1] for s in range(5)]
    assert min(clipped) > 0.75 and max(symmetric) < 0.4


def test_the_comparison_reports_every_design_and_plant() -> None:
    rows = compare([Design(0.8, 0.1), Design(0.7, 1.0)], (0.1,), seeds=4)
    assert len(rows) == 4 and {r["plant"] for r in rows} == {"lr 2e-5", "lr 3e-6"}
    for r in rows:
        assert 0.0 <= float(r["ma_share_min"]) <= float(r["ma_share"]) <= 1.0  # type: ignore[arg-type]
        assert float(r["mean_deviation"]) > 0.0  # type: ignore[arg-type]
