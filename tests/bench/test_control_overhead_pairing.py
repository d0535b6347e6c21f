"""bench/bench_control_overhead.py's paired ratio: a row's step over its reference's step of the same round, so
that slow spells of the machine, which hit both, cancel; its bootstrap interval covers the true ratio."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_control_overhead import paired_ratio


def test_a_constant_ratio_under_shared_slow_spells_is_found_exactly() -> None:
    rng = random.Random(1)
    base = [0.05 * (1 + 3 * rng.random() ** 8) for _ in range(60)]  # rounds the machine slowed, up to 4 ×
    row = [b * 1.02 for b in base]
    out = paired_ratio(row, base)
    assert out == pytest.approx({"paired_ratio": 1.02, "paired_low": 1.02, "paired_high": 1.02}, abs=1e-12)


def test_the_interval_covers_the_ratio_and_narrows_with_more_rounds() -> None:
    rng = random.Random(2)

    def rounds(n: int) -> tuple[list[float], list[float]]:
        base = [0.05 * (1 + rng.random()) for _ in range(n)]
        return [b * 1.03 * rng.gauss(1.0, 0.03) for b in base], base

    few, many = paired_ratio(*rounds(20)), paired_ratio(*rounds(400))
    for out in (few, many):
        assert out["paired_low"] <= 1.03 <= out["paired_high"]
        assert out["paired_low"] <= out["paired_ratio"] <= out["paired_high"]
    assert many["paired_high"] - many["paired_low"] < few["paired_high"] - few["paired_low"]
