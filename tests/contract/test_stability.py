"""Time to collapse and target holding (contract/stability.py): the definitions on hand-made series whose
answers are worked out below, and the step-by-step tracker equal to them on random series."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from contract import stability as st


def _series(values: list[float]) -> list[tuple[int, float]]:
    return [(i + 1, v) for i, v in enumerate(values)]


def test_collapse_is_the_first_step_of_five_below_a_quarter_of_the_start() -> None:
    # H0 = 2.0 → threshold 0.5. Steps 3-6 are below (4 in a row, not enough), step 7 is 0.5 (not below:
    # strict), steps 8-12 are below: the collapse starts at step 8.
    values = [2.0, 1.0, 0.4, 0.3, 0.2, 0.1, 0.5, 0.49, 0.3, 0.2, 0.1, 0.05, 0.6]
    assert st.collapse_step(_series(values)) == 8


def test_no_collapse_without_a_full_streak_and_none_for_an_empty_series() -> None:
    assert st.collapse_step(_series([2.0, 0.1, 0.1, 0.1, 0.1, 0.6, 0.1])) is None
    assert st.collapse_step([]) is None


def test_collapse_threshold_is_relative_to_the_first_step() -> None:
    # The same absolute values collapse from H0 = 2 (threshold 0.5) but not from H0 = 0.3 (0.075).
    tail = [0.2] * 5
    assert st.collapse_step(_series([2.0, *tail])) == 2
    assert st.collapse_step(_series([0.3, *tail])) is None


def test_hold_window_starts_at_the_first_step_below_the_target() -> None:
    # Target 1.0, near means 0.75 ≤ H ≤ 1.25. Steps 1-2 above the target (outside the window); the window is
    # steps 3-7: 0.9 (near), 1.3 (not), 1.25 (near, edge), 0.7 (not), 0.75 (near, edge) → 3/5.
    values = [2.0, 1.1, 0.9, 1.3, 1.25, 0.7, 0.75]
    assert st.hold_fraction(_series(values), 1.0) == (pytest.approx(3 / 5), 5)


def test_hold_is_undefined_before_the_target_is_reached_or_without_one() -> None:
    assert st.hold_fraction(_series([2.0, 1.9, 1.8]), 1.0) == (None, 0)
    assert st.hold_fraction(_series([0.5, 0.5]), None) == (None, 0)


@pytest.mark.parametrize("seed", range(20))
def test_tracker_equals_the_definitions_on_every_prefix(seed: int) -> None:
    rng = random.Random(seed)
    target = rng.choice([None, 0.5, 1.0, 1.5])
    h = rng.uniform(1.0, 3.0)
    values = []
    tracker = st.StabilityTracker()
    for _ in range(60):
        h = max(0.0, h + rng.gauss(-0.04, 0.3))
        values.append(h)
        metrics = tracker.update(h, target)
        series = _series(values)
        assert metrics[st.COLLAPSE_STEP] == float(st.collapse_step(series) or 0)
        share, n = st.hold_fraction(series, target)
        assert metrics[st.POST_GATE_STEPS] == n
        assert metrics.get(st.HOLD_FRACTION) == (None if share is None else pytest.approx(share))
        # A checkpoint round trip mid-run changes nothing.
        tracker = st.StabilityTracker(st.StabilityState.from_dict(tracker.state.to_dict()))


def test_metric_keys_are_in_the_catalogue() -> None:
    from contract.metrics import COLLAPSE_STEP, POST_GATE_STEPS, TARGET_HOLD_FRACTION

    assert (COLLAPSE_STEP, TARGET_HOLD_FRACTION, POST_GATE_STEPS) == (
        st.COLLAPSE_STEP,
        st.HOLD_FRACTION,
        st.POST_GATE_STEPS,
    )


def test_holding_settles_at_the_first_moving_average_in_the_band() -> None:
    # Target 1.0 (band 0.75-1.25). Moving averages of 5: steps 1-4 none; step 5: mean(2,2,2,1,1) = 1.6;
    # step 6: mean(2,2,1,1,1) = 1.4; step 7: mean(2,1,1,1,1) = 1.2 (in: settles at step 7); step 8: 1.0;
    # step 9: mean(1,1,1,1,3) = 1.4 (out) → share 2/3. |H − 1| from step 7: 0, 0, 2 → mean 2/3. The moving
    # average's |M − 1| from step 7: 0.2, 0, 0.4 → mean 0.2; its largest excursion above: 0.4 (step 9).
    values = [2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0]
    held = st.holding(_series(values), 1.0)
    assert held == st.Holding(
        7, pytest.approx(2 / 3), pytest.approx(2 / 3), 3, pytest.approx(0.2), pytest.approx(0.4)
    )


def test_holding_is_undefined_without_a_target_or_before_settling() -> None:
    assert st.holding(_series([1.0] * 10), None) == st.Holding(None, None, None, 0)
    assert st.holding(_series([3.0] * 10), 1.0) == st.Holding(None, None, None, 0)
    assert st.holding(_series([1.0] * 4), 1.0) == st.Holding(None, None, None, 0)  # no full window yet


def test_moving_average_needs_a_full_window() -> None:
    assert st.moving_average([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]) == [None, None, None, None, 3.0, 4.0]


def test_step_noise_is_the_rms_successive_difference_over_root_two() -> None:
    # ±0.1 alternating around 1.0: successive differences of 0.2, so √(0.04 / 2) = 0.1414, over a target of 0.5.
    assert st.step_noise([1.1, 0.9, 1.1, 0.9], 0.5) == pytest.approx(math.sqrt(0.02) / 0.5)
    # Blind to a slow level: white noise of sd 0.05 on a ramp from 1 to 2 reads 0.05 (a plain sd reads ~0.29).
    rng = random.Random(0)
    values = [1.0 + i / 2000 + rng.gauss(0.0, 0.05) for i in range(2000)]
    assert st.step_noise(values, 1.0) == pytest.approx(0.05, rel=0.05)
    assert statistics.stdev(values) > 0.25
    assert st.step_noise([1.0, 1.0], 1.0) is None and st.step_noise([1.0, 1.1, 1.0], 0.0) is None


def test_noise_floor_is_the_spread_of_resampled_entropies() -> None:
    floor = st.noise_floor([0.9, 1.1, 1.0, 1.0])
    assert floor["mean"] == pytest.approx(1.0)
    assert floor["sd"] == pytest.approx((0.02 / 3) ** 0.5)
    assert floor["relative_sd"] == pytest.approx(floor["sd"])
    with pytest.raises(ValueError, match="at least 2 finite"):
        st.noise_floor([1.0])
    with pytest.raises(ValueError, match="at least 2 finite"):
        st.noise_floor([1.0, float("nan")])


@pytest.mark.parametrize("seed", range(20))
def test_tracker_holding_equals_the_definition_on_every_prefix(seed: int) -> None:
    rng = random.Random(seed)
    target = rng.choice([None, 0.5, 1.0, 1.5])
    h = rng.uniform(0.5, 2.0)
    values = []
    tracker = st.StabilityTracker()
    for _ in range(60):
        h = max(0.0, h + rng.gauss(0.0, 0.2))
        values.append(h)
        metrics = tracker.update(h, target)
        held = st.holding(_series(values), target)
        assert metrics.get(st.SETTLING_STEP) == (None if held.settling_step is None else held.settling_step)
        assert metrics.get(st.MA_HOLD_FRACTION) == (
            None if held.ma_hold_fraction is None else pytest.approx(held.ma_hold_fraction)
        )
        assert metrics.get(st.MEAN_ABS_DEVIATION) == (
            None if held.mean_abs_deviation is None else pytest.approx(held.mean_abs_deviation)
        )
        assert metrics.get(st.MA_MEAN_ABS_DEVIATION) == (
            None if held.ma_mean_abs_deviation is None else pytest.approx(held.ma_mean_abs_deviation)
        )
        assert metrics.get(st.MA_MAX_EXCURSION) == (
            None if held.ma_max_excursion is None else pytest.approx(held.ma_max_excursion)
        )
        tracker = st.StabilityTracker(st.StabilityState.from_dict(tracker.state.to_dict()))


def test_holding_metric_keys_are_in_the_catalogue() -> None:
    from contract import metrics

    for key in (st.SETTLING_STEP, st.MA_HOLD_FRACTION, st.MEAN_ABS_DEVIATION):
        assert metrics.get(key).key == key
