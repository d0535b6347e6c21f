"""The per-step controllers, by the names their algorithms' registrations give (contract.algorithms).

A controller is tensor-free: once per optimiser step, before the update, it reads the step's measured
statistics (H̄, the token-mean entropy of π_old over the training batch) and moves its state, which the
loss reads as its `control` argument. It owns its metrics and its checkpointed state. The engine holds a
list of them (`trainer.controllers.Controllers`) and never asks which algorithm it runs.

Implementations: STARE's gate (`stare.StareGate`), the adaptive entropy coefficient
(`entropy_control.EntropyCoefController`) and the PI entropy laws (`pi_control`: entropy_pi, stare_pi,
clip_pi).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from contract import algorithms
from contract.hyperparams import ClipLossParams

__all__ = ["CONTROLLER_FACTORIES", "Controller", "StepStatistics", "check_control", "make_controller"]


@dataclass(frozen=True)
class StepStatistics:
    """What a controller reads each step, measured on π_old over the step batch of every process."""

    batch_entropy: float  # H̄ (nats)


class Controller(Protocol):
    """One per-step controller. `state_cls` is a frozen dataclass with to_dict/from_dict and a `check()`
    that raises ValueError on an out-of-bounds state."""

    @property
    def name(self) -> str: ...

    @property
    def state_cls(self) -> Any: ...

    @property
    def target_entropy(self) -> float:
        """The target, resolved (nats)."""
        ...

    def initial_state(self) -> Any: ...

    def update(self, state: Any, stats: StepStatistics) -> Any: ...

    def metrics(self, state: Any, stats: StepStatistics) -> dict[str, float]: ...

    def metric_names(self) -> frozenset[str]: ...

    def token_weights(
        self, state: Any, old_logprob: Any, advantages: Any, mask: Any
    ) -> tuple[Any, dict[str, float]]:
        """Token weights over the whole step batch from π_old's log-probs (B, R), or (None, {})."""
        ...


# name → (settings, loss params) → controller. Filled by stare.py, entropy_control.py and pi_control.py.
CONTROLLER_FACTORIES: dict[str, Callable[[Any, ClipLossParams], Controller]] = {}
# name → its state class, for `check_control` (the losses' side).
STATE_CLASSES: dict[str, type] = {}


def register_controller(
    name: str, state_cls: type
) -> Callable[[Callable[[Any, ClipLossParams], Controller]], Callable[[Any, ClipLossParams], Controller]]:
    if name not in algorithms.CONTROLLERS:
        raise ValueError(f"controller {name!r} is not in contract.algorithms.CONTROLLERS")

    def add(
        factory: Callable[[Any, ClipLossParams], Controller],
    ) -> Callable[[Any, ClipLossParams], Controller]:
        if name in CONTROLLER_FACTORIES:
            raise ValueError(f"controller {name!r} is registered twice")
        CONTROLLER_FACTORIES[name] = factory
        STATE_CLASSES[name] = state_cls
        return factory

    return add


def make_controller(algorithm: str, settings: Any, loss_params: ClipLossParams) -> Controller | None:
    """The controller of `algorithm` with its settings (target resolved); None for one without."""
    name = algorithms.get(algorithm).controller
    return None if name is None else CONTROLLER_FACTORIES[name](settings, loss_params)


def check_control(algorithm: str, control: Any) -> None:
    """A loss's `control` argument, where it enters the loss: None, or a state of the algorithm's own
    controller within its bounds. A loss without a controller refuses any control."""
    if control is None:
        return
    name = algorithms.get(algorithm).controller
    if name is None:
        raise ValueError(f"loss {algorithm!r} has no controller, so it takes no control (got {control!r})")
    state_cls = STATE_CLASSES[name]
    if not isinstance(control, state_cls):
        raise ValueError(
            f"control for loss {algorithm!r} must be {state_cls.__name__}, got {type(control).__name__}"
        )
    cast(Any, control).check()
