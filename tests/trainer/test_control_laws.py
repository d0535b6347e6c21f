"""The PI entropy laws (contract/control/pi.py, trainer/algos/pi_control.py) on a simulated plant: a first-order
entropy model with drift and noise,

    ln H_{k+1} = ln H_k − δ + g·(a_k − a⁰) + process noise,   H̄_k = H_k · exp(measurement noise)

where a_k is the actuator's value the controller set (α, W or ε_high), a⁰ its value at u = 0 and g the
plant's gain per unit of it, sized so that u = 1 moves ln H by the law's design response B
(docs/ALGORITHMS.md §11). δ = 0.04 per step (the SmolLM2 suite's drift at lr 3e-6; 0.0575 at 2e-5)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from contract import control
from contract.control import pi as law
from contract.control.pi import PiState
from contract.stability import holding

TARGET = 0.7
DRIFT = 0.04


def _controllers() -> dict[str, Callable[..., Any]]:
    return {
        name: (lambda name=name, **kw: control.bind(name, target_entropy=TARGET, **kw)) for name in RESPONSE
    }


def actuator_at(bound: control.Bound, u: float) -> float:
    """The actuator's value the law sets for output u."""
    return law.actuator_values(bound.name, u, bound.settings, bound.loss_params)[0]


RESPONSE = {
    "entropy_pi": law.ENTROPY_PI_RESPONSE,
    "stare_pi": law.STARE_PI_RESPONSE,
    "clip_pi": law.CLIP_PI_RESPONSE,
}
LAWS = sorted(RESPONSE)


def simulate(
    name: str,
    *,
    steps: int = 120,
    drift: float = DRIFT,
    noise: float = 0.1,
    h0: float = 1.0,
    seed: int = 0,
    enabled: Callable[[int], bool] = lambda k: True,
    state: PiState | None = None,
    **settings: float,
) -> tuple[list[float], list[PiState], Any]:
    """(H̄ per step, the state after each step, the controller)."""
    controller = _controllers()[name](**settings)
    gain = RESPONSE[name] / controller.settings.span  # per unit of the actuator's value
    at_zero = actuator_at(controller, 0.0)
    rng = random.Random(seed)
    st = state if state is not None else controller.initial_state()
    log_h, seen, states = math.log(h0), [], []
    for k in range(steps):
        h_bar = math.exp(log_h + rng.gauss(0.0, noise))
        st = controller.update(st, h_bar)
        seen.append(h_bar)
        states.append(st)
        push = gain * (st.actuator - at_zero) if enabled(k) else 0.0
        log_h += -drift + push + rng.gauss(0.0, 0.02)
    return seen, states, controller


def _series(values: list[float]) -> list[tuple[int, float]]:
    return [(i + 1, v) for i, v in enumerate(values)]


@pytest.mark.parametrize("name", LAWS)
@pytest.mark.parametrize("seed", range(3))
def test_each_law_settles_and_holds_the_target(name: str, seed: int) -> None:
    seen, _, _ = simulate(name, seed=seed)
    held = holding(_series(seen), TARGET)
    assert held.settling_step is not None and held.settling_step <= 25
    assert held.ma_hold_fraction is not None and held.ma_hold_fraction >= 0.9
    assert held.mean_abs_deviation is not None and held.mean_abs_deviation <= 0.12


@pytest.mark.parametrize("target", [0.3, 2.0])
def test_one_default_fits_a_small_and_a_large_target(target: float) -> None:
    # The error is relative, so the same gains hold 0.3 nats and 2 nats (start at 1.5 × the target).
    controller = control.bind("entropy_pi", target_entropy=target)
    gain = law.ENTROPY_PI_RESPONSE / controller.settings.span
    rng, st, log_h, seen = random.Random(1), controller.initial_state(), math.log(1.5 * target), []
    for _ in range(120):
        h_bar = math.exp(log_h + rng.gauss(0.0, 0.1))
        st = controller.update(st, h_bar)
        seen.append(h_bar)
        log_h += -DRIFT + gain * st.actuator + rng.gauss(0.0, 0.02)
    held = holding(_series(seen), target)
    assert held.ma_hold_fraction is not None and held.ma_hold_fraction >= 0.9
    assert held.mean_abs_deviation is not None and held.mean_abs_deviation <= 0.12


@pytest.mark.parametrize("name", LAWS)
def test_output_and_actuator_are_bounded(name: str) -> None:
    # A plant the actuator cannot move (drift only) and a very noisy one: u never leaves [−u_max, u_max].
    for enabled, noise in ((lambda k: False, 0.1), (lambda k: True, 1.0)):
        _, states, controller = simulate(name, enabled=enabled, noise=noise)
        u_max = controller.settings.u_max
        assert all(-u_max <= s.output <= u_max for s in states)
        lo, hi = sorted((actuator_at(controller, -u_max), actuator_at(controller, u_max)))
        assert all(lo <= s.actuator <= hi for s in states)
    assert states[-1].saturated_steps >= 0


@pytest.mark.parametrize("name", LAWS)
def test_no_windup_while_the_actuator_is_saturated(name: str) -> None:
    # The actuator has no effect for 50 steps (entropy drifts far below the target, u sits at +u_max), then
    # it works again. Without anti-windup the integral grows by ~1 a step and keeps u at its clip long after
    # the target is reached: entropy overshoots far above it and takes long to come back.
    seen, states, controller = simulate(name, steps=160, noise=0.0, h0=TARGET, enabled=lambda k: k >= 50)
    assert all(s.output == controller.settings.u_max for s in states[20:50])
    assert states[49].saturated_steps >= 20  # the alert's condition
    assert abs(states[49].integral) < 5.0
    after = seen[50:]
    assert max(after) <= 1.25 * TARGET  # no overshoot past the band
    back = next(i for i, h in enumerate(after) if abs(h - TARGET) <= 0.25 * TARGET)
    assert all(abs(h - TARGET) <= 0.25 * TARGET for h in after[back:])


@pytest.mark.parametrize("name", LAWS)
def test_the_integral_removes_the_steady_state_error_of_a_constant_drift(name: str) -> None:
    # Noise-free, constant drift: PI ends at the target; P alone (Ki = 0) keeps an error of δ/(B·Kp).
    _, states, _ = simulate(name, noise=0.0, steps=150)
    assert abs(sum(s.error for s in states[-40:]) / 40) < 0.01
    _, p_only, _ = simulate(name, noise=0.0, steps=150, ki=0.0)
    assert sum(s.error for s in p_only[-40:]) / 40 > 0.05


@pytest.mark.parametrize("name", LAWS)
def test_a_resumed_run_continues_exactly(name: str) -> None:
    whole, whole_states, _ = simulate(name, steps=60, seed=3)
    # The same run, stopped after 30 steps: its state through to_dict/from_dict, and the plant where it was.
    first, first_states, _ = simulate(name, steps=30, seed=3)
    restored = PiState.from_dict(first_states[-1].to_dict())
    assert restored == first_states[-1]
    controller = _controllers()[name]()
    st = restored
    for h_bar in whole[30:]:
        st = controller.update(st, h_bar)
    assert st == whole_states[-1]
    assert first == whole[:30]


def test_a_non_finite_measurement_leaves_the_state_unchanged() -> None:
    controller = control.bind("entropy_pi", target_entropy=TARGET)
    st = controller.update(controller.initial_state(), 0.5)
    assert controller.update(st, float("nan")) == st


def test_smoothing_is_an_ema_of_the_measurements() -> None:
    p = law.EntropyPiSettings(target_entropy=1.0, smoothing=0.5)
    st = law.pi_step(PiState(), 0.8, p)
    st = law.pi_step(st, 0.4, p)
    assert st.smoothed == pytest.approx(0.6)
    assert st.error == pytest.approx(0.4)


def test_pole_placement_puts_both_poles_at_the_design_pole() -> None:
    kp, ki = law.pole_placement(0.2, 0.6)
    b = 0.2
    # z² + (B·Kp + B·Ki − 2)·z + (1 − B·Kp) = (z − 0.6)²
    assert b * kp + b * ki - 2 == pytest.approx(-1.2, abs=1e-4)
    assert 1 - b * kp == pytest.approx(0.36, abs=1e-4)
    with pytest.raises(ValueError):
        law.pole_placement(0.0)


def test_state_check_refuses_non_finite_values() -> None:
    with pytest.raises(ValueError, match="integral"):
        PiState(integral=float("inf"))
    with pytest.raises(ValueError, match="actuator"):
        replace(PiState(), actuator=float("nan"))
