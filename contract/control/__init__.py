"""The per-step controllers, one declaration each (contract/control/base.py says what a declaration holds).

The registration list is `BUILT_IN` below: a new law is one module here (its declaration) plus its actuator
in trainer/algos (registered under the same name), and a line in that list. Everything else reads the
registry: the spec's `algorithm.control` (validated by the declaration's settings, keyed by `controller`),
the algorithm registry (a law that is its own algorithm), the engine's controllers, checkpoints, the metric
catalogue and docs/ALGORITHMS.md's table.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from contract.control import entropy_coef, pi, split, stare_gate
from contract.control.base import (
    Bound,
    Controller,
    ControlSettings,
    ControlState,
    OwnAlgorithm,
    RelativeTargetSpec,
    TargetEntropy,
    entropy_target,
)

__all__ = [
    "BUILT_IN",
    "CONTROLLERS",
    "DEFAULT_LAW",
    "Bound",
    "ControlSettings",
    "ControlState",
    "Controller",
    "OwnAlgorithm",
    "RelativeTargetSpec",
    "TargetEntropy",
    "bind",
    "entropy_target",
    "get",
    "names",
    "register",
    "settings_of",
]

BUILT_IN: tuple[Controller, ...] = (
    stare_gate.STARE_GATE,
    entropy_coef.ENTROPY_COEF,
    pi.ENTROPY_PI,
    pi.STARE_PI,
    pi.CLIP_PI,
    split.ENTROPY_SPLIT,
)
# The law a job gets when it sets algorithm.control and names no algorithm (docs/ALGORITHMS.md §11.4).
DEFAULT_LAW = "entropy_pi"

_REGISTERED: dict[str, Controller] = {}
CONTROLLERS: Mapping[str, Controller] = MappingProxyType(_REGISTERED)


def register(controller: Controller) -> Controller:
    """Adds a declaration; its metric keys must not clash with another's unless they are the same entries."""
    if controller.name in _REGISTERED:
        raise ValueError(f"controller {controller.name!r} is registered twice")
    for other in _REGISTERED.values():
        for m in controller.metrics:
            theirs = next((o for o in other.metrics if o.key == m.key), None)
            if theirs is not None and theirs != m:
                raise ValueError(f"metric {m.key!r} is declared differently by {other.name!r}")
    _REGISTERED[controller.name] = controller
    return controller


def unregister(name: str) -> None:
    """Removes a declaration (tests that register a toy law clean up with it)."""
    _REGISTERED.pop(name, None)


for _controller in BUILT_IN:
    register(_controller)


def names() -> list[str]:
    return sorted(_REGISTERED)


def get(name: str) -> Controller:
    try:
        return _REGISTERED[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown controller {name!r}; valid: {', '.join(names())}") from None


def settings_of(data: Any) -> Any:
    """`algorithm.control` as a mapping validated by the settings of the controller it names (the
    union's key); anything else is returned as is for pydantic to refuse."""
    if isinstance(data, ControlSettings) or not isinstance(data, Mapping):
        return data
    controller = get(str(data.get("controller")))
    return controller.settings.model_validate(dict(data))


def bind(name: str, settings: Any = None, loss_params: Any = None, **overrides: Any) -> Bound:
    """Controller `name` with its settings (default: its defaults with `overrides`; the target must be in
    nats) and the loss's parameters (default: the clipped surrogate's)."""
    from contract.hyperparams import ClipLossParams

    controller = get(name)
    if settings is None:
        settings = controller.settings(**overrides)
    return Bound(controller, settings.check_resolved(), loss_params or ClipLossParams())
