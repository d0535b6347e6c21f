"""The PI entropy laws as the engine's controllers, with their actuators' losses (docs/ALGORITHMS.md §11).

The law itself (tensor-free, shared with the simulated-plant tests) is `contract.control.pi_step`; each
controller here turns its output u into what its loss reads (`actuator`):

- `entropy_pi`: α = span·u; loss = grpo_ds per-token loss − α·H_t (`entropy_bonus_term`), α of either
  sign (α < 0 sharpens the policy);
- `stare_pi`: STARE's token weights ω with W (on L⁺) and, for C2, M (on L⁻) from u (`stare_pi_weights`),
  always applied (no gate: u = 0 gives W = M = 1, grpo_ds);
- `clip_pi`: the clipped surrogate with ε_high = clip_high + span·u, kept ≥ 0.

Each controller owns the control/ metrics: output u, error e, integral I, the saturated flag, the count of
consecutive steps at the clip (the alert's input) and the actuator's value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from contract.control import (
    PiControlParams,
    PiState,
    StarePiControl,
    StarePiParams,
    pi_step,
)
from contract.hyperparams import ClipLossParams
from trainer.algos.control import StepStatistics, register_controller
from trainer.algos.stare import stare_weights
from trainer.algos.surrogate import (
    Metrics,
    PolicyLossInputs,
    clipped_surrogate,
    finish,
    prepare,
    register_loss,
)

CONTROL_METRICS = frozenset(
    {
        "control/output",
        "control/error",
        "control/integral",
        "control/saturated",
        "control/saturated_steps",
        "control/actuator",
        "control/target_entropy",
    }
)

# ------------------------------------------------------------------------------------------ actuators


def stare_pi_weights(u: float, p: StarePiControl) -> tuple[float, float]:
    """(W, M) for output u: W = 1 + span·u (u ≥ 0) or 1 + (1 − w_floor)·u (u < 0); M = 1 − (1 − m_min)·u."""
    w = 1.0 + (p.span * u if u >= 0 else (1.0 - p.w_floor) * u)
    m = 1.0 - (1.0 - p.m_min) * u
    return w, m


def clip_high_of(u: float, span: float, centre: float) -> float:
    return max(0.0, centre + span * u)


@dataclass(frozen=True)
class _PiController:
    """What the three laws share: the update, the metrics and the state class."""

    settings: PiControlParams
    loss_params: Any = None
    state_cls = PiState

    @property
    def target_entropy(self) -> float:
        return self.settings.target_entropy

    def initial_state(self) -> PiState:
        return self._actuate(PiState())

    def update(self, state: PiState, stats: StepStatistics) -> PiState:
        return self._actuate(pi_step(state, stats.batch_entropy, self.settings))

    def _actuate(self, state: PiState) -> PiState:
        return dataclasses.replace(state, actuator=self.actuator(state), actuator_m=self.actuator_m(state))

    def actuator(self, state: PiState) -> float:
        raise NotImplementedError

    def actuator_m(self, state: PiState) -> float | None:
        return None

    def metrics(self, state: PiState, stats: StepStatistics) -> dict[str, float]:
        return {
            "control/output": state.output,
            "control/error": state.error,
            "control/integral": state.integral,
            "control/saturated": float(state.saturated),
            "control/saturated_steps": float(state.saturated_steps),
            "control/actuator": self.actuator(state),
            "control/target_entropy": self.settings.target_entropy,
        }

    def metric_names(self) -> frozenset[str]:
        return CONTROL_METRICS

    def token_weights(
        self, state: PiState, old_logprob: Any, advantages: Any, mask: Any
    ) -> tuple[Tensor | None, dict[str, float]]:
        return None, {}


@register_controller("entropy_pi", PiState)
@dataclass(frozen=True)
class EntropyPi(_PiController):
    name = "entropy_pi"

    def actuator(self, state: PiState) -> float:
        return self.settings.span * state.output


@register_controller("clip_pi", PiState)
@dataclass(frozen=True)
class ClipPi(_PiController):
    name = "clip_pi"

    def actuator(self, state: PiState) -> float:
        centre = getattr(self.loss_params, "clip_high", ClipLossParams.clip_high)
        return clip_high_of(state.output, self.settings.span, centre)


@register_controller("stare_pi", PiState)
@dataclass(frozen=True)
class StarePi(_PiController):
    name = "stare_pi"

    def actuator(self, state: PiState) -> float:
        assert isinstance(self.settings, StarePiControl)
        return stare_pi_weights(state.output, self.settings)[0]

    def actuator_m(self, state: PiState) -> float:
        assert isinstance(self.settings, StarePiControl)
        return stare_pi_weights(state.output, self.settings)[1]

    def token_weights(
        self, state: PiState, old_logprob: Tensor | None, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor | None, dict[str, float]]:
        """ω over the whole step batch (scope step_batch) from π_old's surprisal; None per micro-batch."""
        p = self.loss_params
        if not isinstance(p, StarePiParams) or p.scope != "step_batch" or old_logprob is None:
            return None, {}
        w, m = _stare_wm(state)
        weights, metrics = _weights(old_logprob, advantages, mask, p, w, m)
        return weights, {k: float(v) for k, v in metrics.items()}


# ------------------------------------------------------------------------------------------ losses


def entropy_bonus_term(per_token: Tensor, entropy: Tensor, coef: float) -> Tensor:
    """The per-token loss with the bonus: per_token − α·H_t, α of either sign (α < 0 sharpens)."""
    return per_token - coef * entropy


def _actuator(control: PiState | None, at_zero: float) -> float:
    """The value the controller set, or the actuator's value at u = 0 (no control, or none set)."""
    return at_zero if control is None or control.actuator is None else control.actuator


def _stare_wm(control: PiState | None) -> tuple[float, float]:
    w = _actuator(control, 1.0)
    m = 1.0 if control is None or control.actuator_m is None else control.actuator_m
    return w, m


@register_loss("entropy_pi")
def entropy_pi_loss(
    inputs: PolicyLossInputs, p: ClipLossParams, control: PiState | None = None
) -> tuple[Tensor, Metrics]:
    """grpo_ds per-token loss − α·H_t, α = `control.actuator` (span·u; None: α = 0, grpo_ds)."""
    if inputs.entropy is None:
        raise ValueError("entropy_pi needs inputs.entropy (per-token entropy of the current pass)")
    coef = _actuator(control, 0.0)
    logprob, old, adv, mask = prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    if coef != 0:
        if not inputs.entropy.requires_grad and torch.is_grad_enabled() and logprob.requires_grad:
            raise ValueError("entropy_pi with a non-zero coefficient needs a differentiable entropy")
        per_token = entropy_bonus_term(per_token, inputs.entropy, coef)
    metrics["entropy_bonus/coef"] = torch.tensor(float(coef))
    return finish(per_token, inputs, p, metrics)


def _weights(
    logprob: Tensor, advantages: Tensor, mask: Tensor, p: StarePiParams, w: float, m: float
) -> tuple[Tensor, Metrics]:
    return stare_weights(
        -logprob.detach(),
        advantages,
        mask,
        top_ratio=p.top_ratio,
        reweight_w=w,
        reweight_m=m,
        variant=p.variant,
        gate_on=True,
    )


@register_loss("stare_pi")
def stare_pi_loss(
    inputs: PolicyLossInputs, p: StarePiParams, control: PiState | None = None
) -> tuple[Tensor, Metrics]:
    """ω · (grpo_ds per-token loss), ω from STARE's selection with W (L⁺) and M (L⁻, C2) as the controller
    set them (`control.actuator`, `actuator_m`; None: W = M = 1, grpo_ds), or precomputed over the step
    batch in `inputs.token_weights` (scope step_batch)."""
    w, m = _stare_wm(control)
    logprob, old, adv, mask = prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    if inputs.token_weights is not None:
        weights = inputs.token_weights.float().detach()
    else:
        weights, stare_metrics = _weights(logprob, adv, mask, p, w, m)
        metrics.update(stare_metrics)
    metrics["stare/reweight_w"] = torch.tensor(w)
    metrics["stare/reweight_m"] = torch.tensor(m)
    return finish(per_token * weights, inputs, p, metrics)


@register_loss("clip_pi")
def clip_pi_loss(
    inputs: PolicyLossInputs, p: ClipLossParams, control: PiState | None = None
) -> tuple[Tensor, Metrics]:
    """The clipped surrogate with ε_high = `control.actuator` (clip_high + span·u; None: clip_high)."""
    eps = _actuator(control, p.clip_high)
    logprob, old, adv, mask = prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, dataclasses.replace(p, clip_high=eps))
    return finish(per_token, inputs, p, metrics)
