"""A simulated entropy plant with the features the SmolLM2 runs show (docs/ALGORITHMS.md §12.2), for designing
and testing the entropy laws without a model.

Per RL step k, in x = ln H (nats), with H₀ the first step's entropy:

    x_{k+1} = x_k − δ(x_k, k) + b_up·ā⁺_k − b_down·ā⁻_k + w_k        w: process noise (heavy-tailed)
    ā±_k    = m·ā±_{k−1} + (1 − m)·a±_k                               the optimiser's momentum lag
    H̄_k    = exp(x_k + v_k)                                          v: the sampler's measurement noise

a⁺ = α, the bonus coefficient (raising); a⁻ = κ, the confident-token weight (lowering); b_up and b_down their
gains per unit (ln H per step), which differ (the plant is asymmetric). The drift accelerates as entropy falls
(the collapse feeds itself) and is fast for the first steps (the first updates take the easy entropy):

    δ(x, k) = δ₀ + γ·clip((ln r_acc − (x − ln H₀)) / 1, 0, 1) + (δ_init if k < k_init else 0)

Defaults: the tuning cell (SmolLM2, a+b, lr 2e-5, 4 × 8 samples at temperature 0.7), read off the grpo_ds
and entropy_pi runs of results/ (§12.2 gives the numbers and how they were read).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Plant:
    h0: float = 0.94  # nats, the first step's entropy
    drift: float = 0.05  # δ₀ per step near H₀
    accel: float = 0.08  # γ: extra drift once entropy is far below H₀
    accel_from: float = 0.4  # r_acc: the extra drift starts below r_acc × H₀, and is full an e-fold lower
    init_drift: float = 0.3  # extra drift on the first steps
    init_steps: int = 3
    b_up: float = 0.7  # ln H per step per unit α (the bonus)
    b_down: float = 0.5  # ln H per step per unit κ (confident-token sharpening)
    momentum: float = 0.6  # m: the actuators act through a first-order lag
    process_noise: float = 0.1  # sd of w
    tail: float = 0.05  # probability of a heavy-tailed step (a sudden fall or rise of ±3 sd)
    measurement_noise: float = 0.13  # sd of v (the noise floor at 4 × 8 samples)

    def drift_at(self, x: float, step: int) -> float:
        below = math.log(self.accel_from) - (x - math.log(self.h0))
        extra = self.accel * min(max(below, 0.0), 1.0)
        return self.drift + extra + (self.init_drift if step < self.init_steps else 0.0)

    def scaled(self, **changes: Any) -> Plant:
        return replace(self, **changes)


# A law as the simulation sees it: (state, measured H̄) → (state, α, κ). Built from a controller's step.
Law = Callable[[Any, float], tuple[Any, float, float]]


@dataclass(frozen=True)
class Trace:
    measured: list[float]  # H̄ per step (what the law read)
    true: list[float]  # H per step (the plant)
    outputs: list[float]  # the law's u per step (α > 0 side positive, κ side negative, in actuator units)
    states: list[Any]


def run(
    plant: Plant,
    law: Law,
    state: Any,
    *,
    steps: int = 100,
    seed: int = 0,
    disturbance: Callable[[int], float] = lambda k: 0.0,
    actuator_works: Callable[[int], bool] = lambda k: True,
) -> Trace:
    """One simulated run: `disturbance(k)` is added to x at step k (a push the law must reject);
    `actuator_works(k)` False makes the actuators ineffective at step k (saturation tests)."""
    rng = random.Random(seed)
    x = math.log(plant.h0)
    lag_up = lag_down = 0.0
    measured, true, outputs, states = [], [], [], []
    for k in range(steps):
        h_bar = math.exp(x + rng.gauss(0.0, plant.measurement_noise))
        state, alpha, kappa = law(state, h_bar)
        measured.append(h_bar)
        true.append(math.exp(x))
        outputs.append(alpha - kappa)
        states.append(state)
        works = actuator_works(k)
        lag_up = plant.momentum * lag_up + (1.0 - plant.momentum) * (alpha if works else 0.0)
        lag_down = plant.momentum * lag_down + (1.0 - plant.momentum) * (kappa if works else 0.0)
        noise = rng.gauss(0.0, plant.process_noise)
        if rng.random() < plant.tail:
            noise += rng.choice((-3.0, 3.0)) * plant.process_noise
        x += -plant.drift_at(x, k) + plant.b_up * lag_up - plant.b_down * lag_down + noise + disturbance(k)
    return Trace(measured, true, outputs, states)
