"""The engine's controllers at run time: the list the step updates, their targets resolved, their state
checkpointed.

An algorithm's registration names its controller; its declaration (contract/control: settings, state, pure
step, metrics) is all the engine runs, with the actuator's step-scope token weights (trainer/algos/control.py)
where it has them. Its settings are the spec's `algorithm.control`. A target entropy is absolute (nats) or relative to H₀, the token-mean entropy of π_old on the
first RL step's batch: then the controller is built on that step, before its first update, and the entropy
band (where the spec sets none) is placed around the resolved target. The resolved values are saved in
checkpoints, so a resumed run keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from contract import algorithms
from contract import control as controllers
from contract.control.base import Bound, Controller
from contract.hyperparams import ClipLossParams
from contract.spec import TrainSpec
from contract.stability import StabilityState, StabilityTracker
from trainer.algos.control import StepStatistics, token_weights_of


@dataclass
class Running:
    """A bound controller (its declaration, settings with the target resolved, the loss's parameters) and
    its state."""

    bound: Bound
    state: Any

    @property
    def controller(self) -> Controller:
        return self.bound.controller

    def update(self, stats: StepStatistics) -> None:
        self.state = self.bound.update(self.state, stats.batch_entropy)

    def metrics(self) -> dict[str, float]:
        return self.bound.metrics(self.state)


class Controllers:
    """The algorithm's controllers (zero or one today) with their states, and the resolved targets."""

    def __init__(self, spec: TrainSpec, loss_params: ClipLossParams) -> None:
        self.spec, self.loss_params = spec, loss_params
        self.target = spec.algorithm.target()  # as set: absolute or relative; None without a controller
        self.initial_entropy: float | None = None  # H₀, once measured (relative targets only)
        self.target_entropy: float | None = None  # resolved
        self.band: tuple[float, float] | None = None  # resolved
        self.running: list[Running] = []
        # Time to collapse and target holding (contract/stability.py), one update per RL step.
        self.stability = StabilityTracker()
        if not spec.band_follows_target():
            self.band = (spec.entropy_band.low, spec.entropy_band.high)
        if self.target is not None and not self.target.is_relative:
            self._build(self.target.resolve(None))

    def _build(self, target_entropy: float) -> None:
        self.target_entropy = target_entropy
        if self.band is None:
            self.band = self.spec.band_around(target_entropy)
        settings = self.spec.algorithm.controller_settings(target_entropy)
        name = algorithms.get(self.spec.algorithm.name).controller
        if name is None or settings is None:
            self.running = []
            return
        bound = Bound(controllers.get(name), settings, self.loss_params)
        self.running = [Running(bound, bound.initial_state())]

    @property
    def unresolved(self) -> bool:
        return self.target is not None and self.target_entropy is None

    def resolve(self, batch_entropy: float) -> dict[str, Any] | None:
        """On the first RL step of a relative target: H₀ = H̄, the target and band resolved, the controller
        built. Returns what resolved (for the `targets_resolved` event), or None when nothing was pending."""
        if not self.unresolved:
            return None
        assert self.target is not None
        self.initial_entropy = batch_entropy
        self._build(self.target.resolve(batch_entropy))
        return self.resolved()

    def resolved(self) -> dict[str, Any]:
        assert self.band is not None
        return {
            "target_entropy": self.target_entropy,
            "initial_entropy": self.initial_entropy,
            "relative": None if self.target is None else self.target.relative,
            "band_low": self.band[0],
            "band_high": self.band[1],
        }

    def update(self, stats: StepStatistics) -> None:
        for run in self.running:
            run.update(stats)

    def control(self) -> Any:
        """The state the loss reads this step (None for an algorithm without a controller)."""
        return self.running[0].state if self.running else None

    def token_weights(
        self, old_logprob: Tensor | None, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor | None, dict[str, float]]:
        """Token weights a controller chooses over the whole step batch from π_old (STARE's step scope),
        with their metrics; None where the loss chooses its own per micro-batch."""
        for run in self.running:
            choose = token_weights_of(run.controller.name)
            if choose is None:
                continue
            weights, metrics = choose(run.state, self.loss_params, old_logprob, advantages, mask)
            if weights is not None:
                return weights, metrics
        return None, {}

    def metrics(self, stats: StepStatistics) -> dict[str, float]:
        """The step's controller metrics, and the stability metrics advanced by this step (the engine calls
        this once per RL step, after the update)."""
        out: dict[str, float] = {}
        for run in self.running:
            out.update(run.metrics())
        if self.target_entropy is not None:
            out["entropy/target"] = self.target_entropy
        out.update(self.stability.update(stats.batch_entropy, self.target_entropy))
        return out

    def owned_metrics(self) -> frozenset[str]:
        return frozenset().union(*(run.controller.metric_keys for run in self.running))

    def state_dict(self) -> dict[str, Any]:
        return {
            "controllers": {run.controller.name: run.state.to_dict() for run in self.running},
            "targets": self.resolved() if self.band is not None and not self.unresolved else None,
            "stability": self.stability.state.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores from a checkpoint's state.json, or from one written before controllers had their own
        keys (`controller`: STARE's gate state, saved for every algorithm; `entropy_coef`)."""
        targets = state.get("targets")
        if self.unresolved and targets is not None:
            self.initial_entropy = targets["initial_entropy"]
            self._build(float(targets["target_entropy"]))
            self.band = (float(targets["band_low"]), float(targets["band_high"]))
        saved = state.get("controllers")
        if saved is None:
            legacy = {"stare_gate": state.get("controller"), "entropy_coef": state.get("entropy_coef")}
            saved = {k: v for k, v in legacy.items() if v is not None}
        for run in self.running:
            if run.controller.name in saved:
                run.state = run.controller.state.from_dict(saved[run.controller.name])
        if isinstance(state.get("stability"), dict):
            self.stability = StabilityTracker(StabilityState.from_dict(state["stability"]))
        else:  # a checkpoint from before these metrics: counted from the resumed step on
            self.stability = StabilityTracker(StabilityState(steps=int(state.get("step", 0))))
