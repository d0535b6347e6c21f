"""The controllers' actuators: what a controller's state does to the loss, registered under the controller's
name (the declarations themselves, torch-free, are contract/control: settings, state, step, metrics).

An actuator is the loss of a law that is an algorithm of its own (registered as that algorithm's loss:
`register_actuator(name)` on the loss function), and, where the controller chooses token weights over the
whole step batch from π_old (STARE's step scope), its `token_weights`. The loss reads the controller's state
as its `control` argument, checked where it enters the loss (`check_control`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from contract import algorithms
from contract import control as controllers
from trainer.algos.surrogate import POLICY_LOSSES, LossFn, register_loss

__all__ = [
    "ACTUATORS",
    "Actuator",
    "StepStatistics",
    "check_control",
    "register_actuator",
    "unregister_actuator",
]

TokenWeights = Callable[[Any, Any, Tensor | None, Tensor, Tensor], tuple[Tensor | None, dict[str, float]]]


@dataclass(frozen=True)
class StepStatistics:
    """What a controller reads each step, measured on π_old over the step batch of every process."""

    batch_entropy: float  # H̄ (nats)


@dataclass(frozen=True)
class Actuator:
    """(state, loss params, π_old's log-probs (B, R), Â, mask) → ω over the step batch and its metrics, or
    (None, {}) where the loss chooses per micro-batch."""

    name: str
    token_weights: TokenWeights | None = None


ACTUATORS: dict[str, Actuator] = {}


def register_actuator(name: str, *, token_weights: TokenWeights | None = None) -> Callable[[LossFn], LossFn]:
    """Registers the actuator of controller `name`; decorating its law's loss registers that loss too."""
    controllers.get(name)  # an actuator needs a declaration

    def add(loss: LossFn) -> LossFn:
        if name in ACTUATORS:
            raise ValueError(f"actuator {name!r} is registered twice")
        ACTUATORS[name] = Actuator(name, token_weights)
        if controllers.get(name).own_algorithm is not None:
            register_loss(name)(loss)
        return loss

    return add


def unregister_actuator(name: str) -> None:
    """Removes an actuator and its law's loss (a test's toy law, registered and removed around it)."""
    if ACTUATORS.pop(name, None) is not None:
        POLICY_LOSSES.unregister(name)


def token_weights_of(name: str) -> TokenWeights | None:
    actuator = ACTUATORS.get(name)
    return None if actuator is None else actuator.token_weights


def check_control(algorithm: str, control: Any) -> None:
    """A loss's `control` argument, where it enters the loss: None, or a state of the algorithm's own
    controller within its bounds. A loss without a controller refuses any control."""
    if control is None:
        return
    name = algorithms.get(algorithm).controller
    if name is None:
        raise ValueError(f"loss {algorithm!r} has no controller, so it takes no control (got {control!r})")
    state_cls = controllers.get(name).state
    if not isinstance(control, state_cls):
        raise ValueError(
            f"control for loss {algorithm!r} must be {state_cls.__name__}, got {type(control).__name__}"
        )
    control.check()
