"""The run's warnings during training (contract.warnings): each step's metrics read by the contract's
StepWatch, and what it reports written as `warning` events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contract.protocol import EventType
from contract.spec import TrainSpec
from contract.warnings import StepWatch


class TrainingWarnings:
    """Feeds each step's metrics to a StepWatch and emits its warnings (`emit`: the run's event log)."""

    def __init__(self, spec: TrainSpec, emit: Callable[[dict[str, Any]], None]) -> None:
        target = spec.algorithm.target()
        self.watch = StepWatch(
            total_steps=spec.optim.steps,
            max_new_tokens=spec.sampling.max_new_tokens,
            relative_target=target is not None and target.is_relative,
        )
        self.emit = emit

    def after_step(self, step: int, metrics: dict[str, Any]) -> None:
        for found in self.watch.observe(step, metrics):
            self.emit({"type": EventType.WARNING, **found})
