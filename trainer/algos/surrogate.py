"""What every policy loss shares: the inputs, the loss registry and the PPO clipped surrogate.

The per-token core is the PPO clipped surrogate with decoupled bounds (DAPO's clip-higher) and an optional
dual clip for Â < 0 (Ye et al., "Mastering Complex Control in MOBA Games"):

    ρ = exp(clamp(ℓ_θ − ℓ_old, −20, 20))
    loss_t = max(−Â ρ, −Â clip(ρ, 1−ε_low, 1+ε_high));  dual clip: for Â < 0, min(loss_t, −c Â)

A loss is `(inputs, params, control) → (loss, metrics)`: `control` is the state of the algorithm's
per-step controller (STARE's gate, the adaptive entropy coefficient), passed by the caller each step; None
for the losses without one. The losses register here (`register_loss`); the baselines are in losses.py,
STARE in stare.py, RSI-S in rsi.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from contract import algorithms
from contract.hyperparams import ClipLossParams
from trainer.algos.aggregation import aggregate
from trainer.algos.registry import Registry
from trainer.algos.selection import broadcast_advantages

Metrics = dict[str, Tensor]
LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class PolicyLossInputs:
    """Tensors of one micro-batch. Counts describe the whole optimiser step (None: this batch alone)."""

    logprob: Tensor  # (B, T) current policy at the sampling temperature, differentiable
    old_logprob: Tensor  # (B, T) behaviour policy π_old
    advantages: Tensor  # (B,) or (B, T)
    response_mask: Tensor  # (B, T) 1 on response tokens
    entropy: Tensor | None = None  # (B, T) nats, detached, current pass (rsi_s, forking_8020)
    ref_logprob: Tensor | None = None  # (B, T) reference policy (KL penalty)
    token_weights: Tensor | None = None  # (B, T) STARE ω precomputed over a wider scope
    global_token_count: float | None = None
    global_sequence_count: float | None = None
    max_response_length: int | None = None
    generator: torch.Generator | None = None  # clip_cov's random pick

    def __post_init__(self) -> None:
        shape = self.logprob.shape
        if self.logprob.dim() != 2:
            raise ValueError(f"logprob must be (B, T), got shape {tuple(shape)}")
        for name in ("old_logprob", "response_mask", "entropy", "ref_logprob", "token_weights"):
            value = getattr(self, name)
            if value is not None and value.shape != shape:
                raise ValueError(f"{name} shape {tuple(value.shape)} must equal logprob shape {tuple(shape)}")
        broadcast_advantages(self.advantages, self.logprob)
        if self.global_token_count is not None and not self.global_token_count >= 0:
            raise ValueError(f"global_token_count must be ≥ 0, got {self.global_token_count!r}")
        if self.global_sequence_count is not None and not self.global_sequence_count >= 0:
            raise ValueError(f"global_sequence_count must be ≥ 0, got {self.global_sequence_count!r}")


LossFn = Callable[[PolicyLossInputs, Any, Any], tuple[Tensor, Metrics]]


@dataclass(frozen=True)
class LossEntry:
    fn: LossFn
    params_cls: type[ClipLossParams]
    advantage_estimator: str  # the estimator the method is defined with


POLICY_LOSSES: Registry[LossEntry] = Registry("policy loss")


def register_loss(name: str) -> Callable[[LossFn], LossFn]:
    """Registers `fn` as the loss `name`, with the parameter class and estimator of its registration."""

    def add(fn: LossFn) -> LossFn:
        entry = algorithms.get(name)
        POLICY_LOSSES.register(name)(LossEntry(fn, entry.params_cls, entry.advantage_estimator))
        return fn

    return add


def active_mean(values: Tensor, mask: Tensor) -> Tensor:
    return (values.float() * mask).sum().detach() / mask.sum().clamp_min(1)


def importance_ratio(logprob: Tensor, old_logprob: Tensor) -> Tensor:
    return torch.exp(torch.clamp(logprob - old_logprob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def clipped_surrogate(
    logprob: Tensor, old_logprob: Tensor, advantages: Tensor, mask: Tensor, p: ClipLossParams
) -> tuple[Tensor, Metrics, Tensor]:
    """Per-token clipped (dual-clip) loss (B, T), its clip metrics, and the 'already clipped' mask."""
    ratio = importance_ratio(logprob, old_logprob)  # (B, T)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - p.clip_low, 1.0 + p.clip_high)
    loss = torch.maximum(unclipped, clipped)
    clip_active = clipped > unclipped  # the clipped branch is the larger loss
    dual_active = torch.zeros_like(clip_active)
    if p.dual_clip_c is not None:
        cap = -advantages * p.dual_clip_c
        dual_active = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
    ratio_d = ratio.detach()
    low = (advantages < 0) & (ratio_d < 1.0 - p.clip_low)
    high = (advantages > 0) & (ratio_d > 1.0 + p.clip_high)
    metrics = {
        "clip/low_fraction": active_mean(low, mask),
        "clip/high_fraction": active_mean(high, mask),
        "clip/fraction": active_mean(low | high, mask),
        "clip/dual_fraction": active_mean(dual_active, mask),
        "kl/approx_old": active_mean(old_logprob.detach() - logprob.detach(), mask),
    }
    return loss, metrics, clip_active


def kl_k3(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """k3 = e^(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1 ≥ 0 (Schulman's low-variance estimator)."""
    delta = torch.clamp(ref_logprob - logprob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(delta) - delta - 1.0


def prepare(inputs: PolicyLossInputs) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(ℓ_θ, ℓ_old, Â broadcast to (B, T), mask) in fp32."""
    logprob = inputs.logprob.float()
    old = inputs.old_logprob.float()
    mask = inputs.response_mask.float()
    adv = broadcast_advantages(inputs.advantages, inputs.logprob).float()
    return logprob, old, adv, mask


def kl_penalty(inputs: PolicyLossInputs, p: ClipLossParams, metrics: Metrics) -> Tensor | None:
    """β·k3 per token (B, T), or None when β = 0; records kl/ref_k3."""
    if p.kl_beta <= 0:
        return None
    if inputs.ref_logprob is None:
        raise ValueError("ref_logprob is required when kl_beta > 0")
    k3 = kl_k3(inputs.logprob.float(), inputs.ref_logprob.float())
    metrics["kl/ref_k3"] = active_mean(k3, inputs.response_mask.float())
    return p.kl_beta * k3


def aggregate_step(per_token: Tensor, inputs: PolicyLossInputs, p: ClipLossParams) -> Tensor:
    """The per-token loss reduced with the params' aggregation and the step-global counts."""
    return aggregate(
        per_token,
        inputs.response_mask.float(),
        p.agg_mode,
        global_token_count=inputs.global_token_count,
        global_sequence_count=inputs.global_sequence_count,
        max_response_length=inputs.max_response_length,
    )


def finish(
    per_token: Tensor, inputs: PolicyLossInputs, p: ClipLossParams, metrics: Metrics
) -> tuple[Tensor, Metrics]:
    """Adds the optional KL penalty, aggregates, and fills the shared metrics."""
    penalty = kl_penalty(inputs, p, metrics)
    if penalty is not None:
        per_token = per_token + penalty
    loss = aggregate_step(per_token, inputs, p)
    metrics["loss/policy"] = loss.detach()
    metrics["tokens/active"] = inputs.response_mask.float().sum().detach()
    return loss, metrics
