"""experiments/control_design.py: the noise split the simulated plant takes from the 1 × / 4 × runs, and the
per-seed spread of the committed law's holding figures."""

from __future__ import annotations

import math

import pytest

from experiments.control_design import MEASURED_NOISE, split_noise, spread
from experiments.plant_model import Plant


def test_the_noise_split_recovers_the_noises_that_made_the_step_noise() -> None:
    sensor, process = 0.2, 0.08
    step = lambda k: math.sqrt(sensor**2 / k + process**2 / 2)  # noqa: E731
    assert split_noise(step(1), step(4)) == pytest.approx((sensor, process))
    assert split_noise(step(1), step(9), k=9) == pytest.approx((sensor, process))
    with pytest.raises(ValueError, match="admit no split"):
        split_noise(0.1, 0.12)  # more noise at more samples: no sensor noise to split off


def test_the_spread_falls_with_the_sensor_noise_and_counts_each_bound() -> None:
    at_1x, at_4x = (spread(p, 30, 100) for p in MEASURED_NOISE.values())
    assert at_1x["settled"] == at_4x["settled"] == 1.0
    assert at_4x["deviation"] < at_1x["deviation"]
    for s in (at_1x, at_4x):
        assert s["deviation_p10"] <= s["deviation"] <= s["deviation_p90"]
        assert (
            0 <= s["within_all"] <= min(s["within_deviation"], s["within_share"], s["within_excursion"]) <= 1
        )
    # A plant with no noise at all: every seed inside every bound (the settling transient only).
    quiet = spread(Plant(process_noise=0.0, tail=0.0, measurement_noise=0.0), 3, 100)
    assert quiet["within_all"] == 1.0 and quiet["deviation_sd"] < 1e-9
