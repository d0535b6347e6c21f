"""Policy losses: one registry, one signature, `(inputs, params) → (loss, metrics)`.

Every loss builds a per-token loss (B, T), then reduces it with `aggregation.aggregate`. The shared
per-token core is the PPO clipped surrogate with decoupled bounds (DAPO's clip-higher) and an optional
dual clip for Â < 0 (Ye et al., "Mastering Complex Control in MOBA Games"):

    ρ = exp(clamp(ℓ_θ − ℓ_old, −20, 20))
    loss_t = max(−Â ρ, −Â clip(ρ, 1−ε_low, 1+ε_high));  dual clip: for Â < 0, min(loss_t, −c Â)

Registered losses (ALGORITHMS.md §4–6):
- grpo: ε 0.2/0.2, seq-mean-token-mean, optional β·k3 to a reference policy.
- grpo_ds: ε 0.2/0.28, dual clip c = 10, token-mean (STARE's controlled baseline, STARE with ω ≡ 1).
- dapo: the grpo_ds loss; DAPO's soft overlong penalty is reward shaping (see shaping.py).
- dr_grpo: ε 0.2/0.2, seq-mean-token-sum-norm (pair it with the dr_grpo advantage).
- stare: ω · (grpo_ds per-token loss); ω from `selection.stare_weights` over the micro-batch, or
  precomputed over the whole step batch and passed in `inputs.token_weights`.
- rsi_s: grpo_ds per-token loss on RSI-kept tokens only; denominator all active tokens or kept tokens.
- forking_8020: loss on the top 20 % entropy tokens only; the denominator counts all active tokens.
- clip_cov: random max(1, ⌊r·N⌋) tokens with 1 < cov < 5 that are not already clipped lose their gradient.
- kl_cov: the top max(1, ⌊κ·N⌋) tokens by cov get −Âρ + coef·|ℓ_θ − ℓ_old|; others −Âρ (unclipped).
- adaptive_entropy: grpo_ds per-token loss − α·H_t, α adapted toward a target entropy each step
  (Skywork-OR1's adaptive entropy control; controller in algos/entropy_control.py).

Deliberate departures and choices:
- rsi_s with denominator "kept" divides by the kept count of the scope it is given (a micro-batch), then
  scales by that scope's share of the step's active tokens; only the "all" denominator is exactly
  invariant to micro-batch splitting.
- clip_cov/kl_cov use ε 0.2/0.2 and token-mean by default, as in the Entropy-Mechanism recipes on verl.
- Metrics are 0-d detached tensors, each a mean over the scope's active tokens (so micro-batch values
  combine exactly when weighted by `tokens/active`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from trainer.algos.aggregation import aggregate
from trainer.algos.registry import Registry
from trainer.algos.selection import (
    broadcast_advantages,
    floor_count,
    random_subset_mask,
    rsi_keep_mask,
    stare_weights,
    token_covariance,
    top_entropy_mask,
    top_k_mask,
)
from trainer.hyperparams import (
    LOSS_PARAMS,
    AdaptiveEntropyParams,
    ClipCovParams,
    ClipLossParams,
    ForkingParams,
    KlCovParams,
    RsiParams,
    StareParams,
)
from trainer.hyperparams import make_loss_params as _make_params

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


LossFn = Callable[[PolicyLossInputs, Any], tuple[Tensor, Metrics]]


@dataclass(frozen=True)
class LossEntry:
    fn: LossFn
    params_cls: type[ClipLossParams]
    advantage_estimator: str  # the estimator the method is defined with


POLICY_LOSSES: Registry[LossEntry] = Registry("policy loss")


def _register(name: str) -> Callable[[LossFn], LossFn]:
    def add(fn: LossFn) -> LossFn:
        params_cls, estimator = LOSS_PARAMS[name]
        POLICY_LOSSES.register(name)(LossEntry(fn, params_cls, estimator))
        return fn

    return add


# --------------------------------------------------------------------------- shared pieces


def _active_mean(values: Tensor, mask: Tensor) -> Tensor:
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
        "clip/low_fraction": _active_mean(low, mask),
        "clip/high_fraction": _active_mean(high, mask),
        "clip/fraction": _active_mean(low | high, mask),
        "clip/dual_fraction": _active_mean(dual_active, mask),
        "kl/approx_old": _active_mean(old_logprob.detach() - logprob.detach(), mask),
    }
    return loss, metrics, clip_active


def kl_k3(logprob: Tensor, ref_logprob: Tensor) -> Tensor:
    """k3 = e^(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1 ≥ 0 (Schulman's low-variance estimator)."""
    delta = torch.clamp(ref_logprob - logprob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(delta) - delta - 1.0


def _prepare(inputs: PolicyLossInputs) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    logprob = inputs.logprob.float()
    old = inputs.old_logprob.float()
    mask = inputs.response_mask.float()
    adv = broadcast_advantages(inputs.advantages, inputs.logprob).float()
    return logprob, old, adv, mask


def _kl_penalty(inputs: PolicyLossInputs, p: ClipLossParams, metrics: Metrics) -> Tensor | None:
    """β·k3 per token (B, T), or None when β = 0; records kl/ref_k3."""
    if p.kl_beta <= 0:
        return None
    if inputs.ref_logprob is None:
        raise ValueError("ref_logprob is required when kl_beta > 0")
    k3 = kl_k3(inputs.logprob.float(), inputs.ref_logprob.float())
    metrics["kl/ref_k3"] = _active_mean(k3, inputs.response_mask.float())
    return p.kl_beta * k3


def _finish(
    per_token: Tensor, inputs: PolicyLossInputs, p: ClipLossParams, metrics: Metrics
) -> tuple[Tensor, Metrics]:
    """Adds the optional KL penalty, aggregates, and fills the shared metrics."""
    mask = inputs.response_mask.float()
    penalty = _kl_penalty(inputs, p, metrics)
    if penalty is not None:
        per_token = per_token + penalty
    loss = aggregate(
        per_token,
        mask,
        p.agg_mode,
        global_token_count=inputs.global_token_count,
        global_sequence_count=inputs.global_sequence_count,
        max_response_length=inputs.max_response_length,
    )
    metrics["loss/policy"] = loss.detach()
    metrics["tokens/active"] = mask.sum().detach()
    return loss, metrics


# --------------------------------------------------------------------------- the losses


@_register("grpo")
@_register("grpo_ds")
@_register("dapo")
def clip_policy_loss(inputs: PolicyLossInputs, p: ClipLossParams) -> tuple[Tensor, Metrics]:
    logprob, old, adv, mask = _prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    return _finish(per_token, inputs, p, metrics)


_register("dr_grpo")(clip_policy_loss)


@_register("stare")
def stare_loss(inputs: PolicyLossInputs, p: StareParams) -> tuple[Tensor, Metrics]:
    logprob, old, adv, mask = _prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    if inputs.token_weights is not None:
        weights = inputs.token_weights.float().detach()
    else:
        weights, stare_metrics = stare_weights(
            -logprob.detach(),
            adv,
            mask,
            top_ratio=p.top_ratio,
            reweight_w=p.reweight_w,
            reweight_m=p.reweight_m,
            variant=p.variant,
            gate_on=p.gate_on,
        )
        metrics.update(stare_metrics)
    if p.gate_on:
        per_token = per_token * weights
    metrics["stare/gate_on"] = torch.tensor(float(p.gate_on))
    metrics["stare/reweight_w"] = torch.tensor(p.reweight_w)
    metrics["stare/reweight_m"] = torch.tensor(p.reweight_m)
    return _finish(per_token, inputs, p, metrics)


@_register("rsi_s")
def rsi_s_loss(inputs: PolicyLossInputs, p: RsiParams) -> tuple[Tensor, Metrics]:
    if inputs.entropy is None:
        raise ValueError("rsi_s needs inputs.entropy (per-token entropy of the current pass)")
    logprob, old, adv, mask = _prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    keep, rsi_metrics = rsi_keep_mask(
        -logprob.detach(), inputs.entropy, mask, mode=p.bound_mode, low=p.r_lo, high=p.r_hi, eps=p.entropy_eps
    )
    metrics.update(rsi_metrics)
    per_token = per_token * keep
    if p.denominator == "kept":
        n_active = mask.sum()
        n_kept = keep.sum().to(torch.float32)
        share = n_active / (
            torch.tensor(float(inputs.global_token_count))
            if inputs.global_token_count is not None
            else n_active
        ).clamp_min(1.0)
        loss = (per_token * mask).sum() / n_kept.clamp_min(1.0) * share
        penalty = _kl_penalty(inputs, p, metrics)
        if penalty is not None:  # the KL term is not RSI-masked: normalised as in the "all" mode
            loss = loss + aggregate(
                penalty,
                mask,
                p.agg_mode,
                global_token_count=inputs.global_token_count,
                global_sequence_count=inputs.global_sequence_count,
                max_response_length=inputs.max_response_length,
            )
        metrics["loss/policy"] = loss.detach()
        metrics["tokens/active"] = n_active.detach()
        return loss, metrics
    return _finish(per_token, inputs, p, metrics)


@_register("forking_8020")
def forking_8020_loss(inputs: PolicyLossInputs, p: ForkingParams) -> tuple[Tensor, Metrics]:
    if inputs.entropy is None:
        raise ValueError("forking_8020 needs inputs.entropy (per-token entropy of the current pass)")
    logprob, old, adv, mask = _prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    keep = top_entropy_mask(inputs.entropy, mask, top_ratio=p.top_entropy_ratio)
    metrics["forking/kept_ratio"] = _active_mean(keep, mask)
    return _finish(per_token * keep, inputs, p, metrics)


@_register("clip_cov")
def clip_cov_loss(inputs: PolicyLossInputs, p: ClipCovParams) -> tuple[Tensor, Metrics]:
    logprob, old, adv, mask = _prepare(inputs)
    per_token, metrics, already_clipped = clipped_surrogate(logprob, old, adv, mask, p)
    cov = token_covariance(adv, logprob, mask)
    active = mask.bool()
    window = active & ~already_clipped & (cov > p.cov_lower) & (cov < p.cov_upper)
    k = floor_count(active.sum(), p.clip_cov_ratio).clamp(min=1)
    zeroed = random_subset_mask(window, k, inputs.generator)
    per_token = per_token * (~zeroed)
    metrics["clip_cov/zeroed_fraction"] = _active_mean(zeroed, mask)
    metrics["clip_cov/window_fraction"] = _active_mean(window, mask)
    return _finish(per_token, inputs, p, metrics)


@_register("kl_cov")
def kl_cov_loss(inputs: PolicyLossInputs, p: KlCovParams) -> tuple[Tensor, Metrics]:
    logprob, old, adv, mask = _prepare(inputs)
    _, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)  # metrics only: kl_cov is unclipped
    ratio = importance_ratio(logprob, old)
    cov = token_covariance(adv, logprob, mask)
    active = mask.bool()
    k = floor_count(active.sum(), p.kl_cov_ratio).clamp(min=1)
    penalised = top_k_mask(cov, active, k)
    per_token = -adv * ratio + torch.where(
        penalised, p.kl_cov_coef * (logprob - old).abs(), torch.zeros_like(ratio)
    )
    metrics["kl_cov/penalised_fraction"] = _active_mean(penalised, mask)
    return _finish(per_token, inputs, p, metrics)


@_register("adaptive_entropy")
def adaptive_entropy_loss(inputs: PolicyLossInputs, p: AdaptiveEntropyParams) -> tuple[Tensor, Metrics]:
    """grpo_ds per-token loss − α·H_t; H_t must carry its gradient (kernels' entropy_grad) when α > 0."""
    if inputs.entropy is None:
        raise ValueError("adaptive_entropy needs inputs.entropy (per-token entropy of the current pass)")
    logprob, old, adv, mask = _prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    if p.coef > 0:
        if not inputs.entropy.requires_grad and torch.is_grad_enabled() and logprob.requires_grad:
            raise ValueError("adaptive_entropy with coef > 0 needs a differentiable entropy")
        per_token = per_token - p.coef * inputs.entropy
    metrics["entropy_bonus/coef"] = torch.tensor(float(p.coef))
    return _finish(per_token, inputs, p, metrics)


# --------------------------------------------------------------------------- entry points

# Losses whose every term is a multiple of the advantage at the same token (clipped surrogate, STARE's ω
# multiplies Â, RSI/forking/Clip-Cov masks multiply it): a row whose advantage is exactly 0 gives exactly
# 0 gradient, whatever its log-probs. KL-Cov is not one of them: its penalty |ℓ − ℓ_old| on the tokens it
# picks reaches rows with Â = 0 once the policy moved (ppo_epochs > 1), and so is any loss with β > 0.
ZERO_ADVANTAGE_NO_GRADIENT = frozenset(
    {"grpo", "grpo_ds", "dapo", "dr_grpo", "stare", "rsi_s", "forking_8020", "clip_cov"}
)


def zero_advantage_rows_inert(name: str, params: ClipLossParams) -> bool:
    """Whether rows with advantage exactly 0 contribute exactly 0 to the gradient of loss `name`, so a
    trainer may score them without autograd (their values still enter the loss and its metrics)."""
    POLICY_LOSSES.get(name)
    return name in ZERO_ADVANTAGE_NO_GRADIENT and params.kl_beta <= 0


def make_loss_params(name: str, **overrides: Any) -> ClipLossParams:
    """The named loss's parameters with overrides; an unknown parameter is an error naming it."""
    POLICY_LOSSES.get(name)  # unknown names fail with the registry's message
    return _make_params(name, **overrides)


def compute_policy_loss(
    name: str, inputs: PolicyLossInputs, params: ClipLossParams | None = None, **overrides: Any
) -> tuple[Tensor, Metrics]:
    entry = POLICY_LOSSES.get(name)
    if params is None:
        params = make_loss_params(name, **overrides)
    elif overrides:
        params = dataclasses.replace(params, **overrides)
    if not isinstance(params, entry.params_cls):
        raise ValueError(
            f"params for loss {name!r} must be {entry.params_cls.__name__}, got {type(params).__name__}"
        )
    return entry.fn(inputs, params)
