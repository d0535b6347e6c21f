"""A toy controller, declared as a new law would be (contract/control): a constant-output law. It is the whole
contract side of adding a controller; tests/trainer/test_toy_controller.py adds its actuator and registers
both. Torch-free, like every declaration."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

from pydantic import Field

from contract.control.base import Controller, ControlSettings, ControlState, OwnAlgorithm
from contract.metrics_types import Surface, metric

NAME = "toy_constant"


class ToySettings(ControlSettings):
    controller: Literal["toy_constant"] = "toy_constant"
    level: Annotated[float, Field(ge=0.0, le=1.0)] = 0.25  # the output, whatever H̄ is


@dataclass(frozen=True)
class ToyState(ControlState):
    output: float = 0.0
    updates: int = 0
    last_entropy: float | None = None


def step(state: ToyState, batch_entropy: float, p: ToySettings, loss_params: Any) -> ToyState:
    return replace(state, output=p.level, updates=state.updates + 1, last_entropy=batch_entropy)


TOY = Controller(
    NAME,
    ToySettings,
    ToyState,
    initial=lambda p, loss_params: ToyState(),
    step=step,
    read=lambda state, p: {"toy/output": state.output, "toy/updates": float(state.updates)},
    metrics=(
        metric("toy/output", "output", "The toy law's output (its level).", shown=[Surface.REPORT]),
        metric("toy/updates", "steps", "Steps the toy law has run."),
    ),
    own_algorithm=OwnAlgorithm(),
)
