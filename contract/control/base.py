"""What every controller declaration shares: the target, the settings' base, the frozen state's base and the
declaration itself (contract/control/__init__.py registers them). Torch-free.

A controller is a law with a state. Once per optimiser step, before the update, it reads H̄ (the token-mean
entropy of π_old over the step batch) and moves its state; the loss reads the state (the trainer's actuator,
registered under the controller's name in trainer/algos/control.py). Its declaration says everything else:
its settings (a pydantic model, the spec's `algorithm.control` section, with the one `target_entropy`), its
state (a frozen dataclass on `ControlState`), its pure step, the metrics it logs (declared with
`metric(...)`), and what it needs (an off-policy update; its own algorithm when the law is one).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field

from contract.hyperparams import DEFAULT_TARGET_ENTROPY, RELATIVE_TARGET_MAX, ClipLossParams, EntropyTarget
from contract.metrics_types import Metric
from contract.numbers import finite

MAX_ENTROPY_NATS = 100.0  # entropies in nats: ln(vocabulary) is below 13 for every vocabulary in use


class RelativeTargetSpec(BaseModel):
    """A target entropy relative to H₀, the token-mean entropy of π_old on the first RL step's batch."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    relative: Annotated[float, Field(gt=0.0, le=RELATIVE_TARGET_MAX)]


# A controller's target entropy: nats, or {relative: r} (r × H₀, resolved on the first RL step).
TargetEntropy = Annotated[float, Field(ge=0.0, le=MAX_ENTROPY_NATS)] | RelativeTargetSpec


def entropy_target(value: float | RelativeTargetSpec) -> EntropyTarget:
    if isinstance(value, RelativeTargetSpec):
        return EntropyTarget(relative=value.relative)
    return EntropyTarget(nats=float(value))


class ControlSettings(BaseModel):
    """A controller's settings: `controller` names the declaration (the union's key), `target_entropy` is its
    one target. `resolved(nats)` is the copy the law runs with, its target in nats."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    controller: str
    target_entropy: TargetEntropy = DEFAULT_TARGET_ENTROPY

    @property
    def target(self) -> EntropyTarget:
        return entropy_target(self.target_entropy)

    @property
    def nats(self) -> float:
        """The target in nats (a resolved copy, or an absolute target)."""
        if isinstance(self.target_entropy, RelativeTargetSpec):
            raise ValueError("a relative target must be resolved (`resolved(nats)`) before the law runs")
        return float(self.target_entropy)

    def resolved(self, nats: float) -> Self:
        return self.model_copy(update={"target_entropy": float(nats)})

    def check_resolved(self) -> Self:
        """Raises ValueError naming the setting when the law's settings cannot run at this target (checks
        that need the target in nats; a relative target is checked once resolved)."""
        return self


_KINDS: dict[type, tuple[tuple[str, type, bool], ...]] = {}


def _field_kinds(cls: type) -> tuple[tuple[str, type, bool], ...]:
    """(name, base type, optional) of a state class's fields, resolved once per class (a state is checked on
    every construction: every step of the law)."""
    if cls in _KINDS:
        return _KINDS[cls]
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        optional = type(None) in typing.get_args(kind)
        base = next((a for a in typing.get_args(kind) if a is not type(None)), kind) if optional else kind
        out.append((f.name, base, optional))
    _KINDS[cls] = tuple(out)
    return _KINDS[cls]


@dataclass(frozen=True)
class ControlState:
    """A controller's state: frozen, checked on construction and where it enters a loss (`check`), saved in
    checkpoints (`to_dict` / `from_dict`). Floats must be finite, optional floats finite or None, ints ≥ 0,
    flags booleans; a subclass adds its own bounds in `bounds`."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        for name, base, optional in _field_kinds(type(self)):
            _check_value(name, getattr(self, name), base, optional)
        self.bounds()

    def bounds(self) -> None:
        """Bounds beyond the types (ValueError naming the field)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        return cls(**data)


def _check_value(name: str, value: Any, base: type, optional: bool) -> None:
    if value is None and optional:
        return
    if base is bool and not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    if base is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be an integer ≥ 0, got {value!r}")
    if base is float and (isinstance(value, bool) or finite(value) is None):
        qualifier = " or None" if optional else ""
        raise ValueError(f"{name} must be a finite number{qualifier}, got {value!r}")


Step = Callable[[Any, float, Any, ClipLossParams], Any]  # (state, H̄, settings resolved, loss params) → state
Initial = Callable[[Any, ClipLossParams], Any]  # (settings resolved, the loss's parameters) → state
Read = Callable[[Any, Any], dict[str, float]]  # (state, settings resolved) → the step's metrics


@dataclass(frozen=True)
class OwnAlgorithm:
    """A law that is an algorithm of its own (grpo_ds's surrogate with the law's actuator): its loss's
    parameters and properties, for contract/algorithms.py's registration."""

    params_cls: type[ClipLossParams] = ClipLossParams
    zero_advantage_inert: bool = True
    differentiable_entropy: bool = False


@dataclass(frozen=True)
class Controller:
    """One controller's declaration (module docstring)."""

    name: str
    settings: type[ControlSettings]
    state: type[ControlState]
    initial: Initial
    step: Step
    read: Read
    metrics: tuple[Metric, ...]
    # What it sets at every step; a spec may not set these in algorithm.params.
    controls: frozenset[str] = frozenset()
    # The actuator acts only on an off-policy update (optim.ppo_epochs ≥ 2): clip_pi's ratio clip.
    needs_off_policy: bool = False
    own_algorithm: OwnAlgorithm | None = None
    # Laws whose output u moves an actuator both ways (the job view's `control` block reads them).
    closed_loop: bool = False

    def __post_init__(self) -> None:
        field = self.settings.model_fields.get("controller")
        if field is None or field.default != self.name:
            raise ValueError(f"controller {self.name!r}: its settings must default `controller` to its name")
        keys = [m.key for m in self.metrics]
        if len(set(keys)) != len(keys):
            raise ValueError(f"controller {self.name!r} declares a metric twice")

    @property
    def metric_keys(self) -> frozenset[str]:
        return frozenset(m.key for m in self.metrics)

    def settings_of(self, data: Mapping[str, Any]) -> ControlSettings:
        return self.settings.model_validate({**data, "controller": self.name})


@dataclass(frozen=True)
class Bound:
    """A declaration with its settings (target resolved) and the loss's parameters: what the engine runs and
    a simulated plant drives."""

    controller: Controller
    settings: Any
    loss_params: ClipLossParams = dataclasses.field(default_factory=ClipLossParams)

    @property
    def name(self) -> str:
        return self.controller.name

    def initial_state(self) -> Any:
        return self.controller.initial(self.settings, self.loss_params)

    def update(self, state: Any, batch_entropy: float) -> Any:
        return self.controller.step(state, batch_entropy, self.settings, self.loss_params)

    def metrics(self, state: Any) -> dict[str, float]:
        return self.controller.read(state, self.settings)
