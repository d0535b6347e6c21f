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
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from trainer.algos.aggregation import AggMode, aggregate, parse_agg_mode
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


def _finite(name: str, value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


@dataclass(frozen=True)
class ClipLossParams:
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip_c: float | None = 10.0
    agg_mode: str = AggMode.TOKEN_MEAN.value
    kl_beta: float = 0.0

    def __post_init__(self) -> None:
        _finite("clip_low", self.clip_low)
        _finite("clip_high", self.clip_high)
        if not 0.0 <= self.clip_low < 1.0:
            raise ValueError(f"clip_low must be in [0, 1), got {self.clip_low!r}")
        if self.clip_high < 0.0:
            raise ValueError(f"clip_high must be ≥ 0, got {self.clip_high!r}")
        if self.dual_clip_c is not None:
            _finite("dual_clip_c", self.dual_clip_c)
            if self.dual_clip_c <= 1.0:
                raise ValueError(f"dual_clip_c must be > 1 (or None), got {self.dual_clip_c!r}")
        parse_agg_mode(self.agg_mode)
        _finite("kl_beta", self.kl_beta)
        if self.kl_beta < 0:
            raise ValueError(f"kl_beta must be ≥ 0, got {self.kl_beta!r}")


@dataclass(frozen=True)
class GrpoParams(ClipLossParams):
    clip_high: float = 0.2
    dual_clip_c: float | None = None
    agg_mode: str = AggMode.SEQ_MEAN_TOKEN_MEAN.value


@dataclass(frozen=True)
class DrGrpoParams(ClipLossParams):
    clip_high: float = 0.2
    dual_clip_c: float | None = None
    agg_mode: str = AggMode.SEQ_MEAN_TOKEN_SUM_NORM.value


@dataclass(frozen=True)
class StareParams(ClipLossParams):
    top_ratio: float = 0.1  # P
    reweight_w: float = 1.1  # W
    reweight_m: float = 0.9  # M (C2 only)
    variant: Literal["O1", "C2"] = "O1"
    scope: Literal["micro_batch", "step_batch"] = "micro_batch"
    gate_on: bool = True  # set each step from the controller state

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("top_ratio", self.top_ratio)
        # P = 0 is accepted as "select nothing" (ALGORITHMS §7.9: P = 0 gives grpo_ds bit for bit).
        if not 0.0 <= self.top_ratio <= 1.0:
            raise ValueError(f"top_ratio (P) must be in (0, 1] (or 0 to disable), got {self.top_ratio!r}")
        _finite("reweight_w", self.reweight_w)
        if self.reweight_w < 1.0:
            raise ValueError(f"reweight_w (W) must be ≥ 1, got {self.reweight_w!r}")
        _finite("reweight_m", self.reweight_m)
        if not 0.0 < self.reweight_m <= 1.0:
            raise ValueError(f"reweight_m (M) must be in (0, 1], got {self.reweight_m!r}")
        if self.variant not in ("O1", "C2"):
            raise ValueError(f"variant must be 'O1' or 'C2', got {self.variant!r}")
        if self.scope not in ("micro_batch", "step_batch"):
            raise ValueError(f"scope must be 'micro_batch' or 'step_batch', got {self.scope!r}")


@dataclass(frozen=True)
class RsiParams(ClipLossParams):
    bound_mode: Literal["fixed", "quantile"] = "fixed"
    r_lo: float = 0.5  # fixed: RSI bound; quantile: quantile level
    r_hi: float = 2.0
    denominator: Literal["all", "kept"] = "all"
    entropy_eps: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("r_lo", self.r_lo)
        _finite("r_hi", self.r_hi)
        if self.r_lo > self.r_hi:
            raise ValueError(f"r_lo must be ≤ r_hi, got r_lo={self.r_lo!r} > r_hi={self.r_hi!r}")
        if self.r_lo < 0:
            raise ValueError(f"r_lo must be ≥ 0, got {self.r_lo!r}")
        if self.bound_mode not in ("fixed", "quantile"):
            raise ValueError(f"bound_mode must be 'fixed' or 'quantile', got {self.bound_mode!r}")
        if self.bound_mode == "quantile" and self.r_hi > 1.0:
            raise ValueError(f"r_hi must be a quantile level in [0, 1] in quantile mode, got {self.r_hi!r}")
        if self.denominator not in ("all", "kept"):
            raise ValueError(f"denominator must be 'all' or 'kept', got {self.denominator!r}")
        if not self.entropy_eps > 0:
            raise ValueError(f"entropy_eps must be > 0, got {self.entropy_eps!r}")


@dataclass(frozen=True)
class ForkingParams(ClipLossParams):
    top_entropy_ratio: float = 0.2

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("top_entropy_ratio", self.top_entropy_ratio)
        if not 0.0 < self.top_entropy_ratio <= 1.0:
            raise ValueError(f"top_entropy_ratio must be in (0, 1], got {self.top_entropy_ratio!r}")


@dataclass(frozen=True)
class ClipCovParams(ClipLossParams):
    clip_high: float = 0.2
    dual_clip_c: float | None = None
    clip_cov_ratio: float = 2e-4
    cov_lower: float = 1.0
    cov_upper: float = 5.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("clip_cov_ratio", self.clip_cov_ratio)
        if not 0.0 <= self.clip_cov_ratio <= 1.0:
            raise ValueError(f"clip_cov_ratio must be in [0, 1], got {self.clip_cov_ratio!r}")
        if self.cov_lower > self.cov_upper:
            raise ValueError(f"cov_lower must be ≤ cov_upper, got {self.cov_lower!r} > {self.cov_upper!r}")


@dataclass(frozen=True)
class KlCovParams(ClipLossParams):
    clip_high: float = 0.2
    dual_clip_c: float | None = None
    kl_cov_ratio: float = 2e-3
    kl_cov_coef: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _finite("kl_cov_ratio", self.kl_cov_ratio)
        if not 0.0 <= self.kl_cov_ratio <= 1.0:
            raise ValueError(f"kl_cov_ratio must be in [0, 1], got {self.kl_cov_ratio!r}")
        _finite("kl_cov_coef", self.kl_cov_coef)
        if self.kl_cov_coef < 0:
            raise ValueError(f"kl_cov_coef must be ≥ 0, got {self.kl_cov_coef!r}")


LossFn = Callable[[PolicyLossInputs, Any], tuple[Tensor, Metrics]]


@dataclass(frozen=True)
class LossEntry:
    fn: LossFn
    params_cls: type[ClipLossParams]
    advantage_estimator: str  # the estimator the method is defined with


POLICY_LOSSES: Registry[LossEntry] = Registry("policy loss")


def _register(
    name: str, params_cls: type[ClipLossParams], advantage_estimator: str = "grpo"
) -> Callable[[LossFn], LossFn]:
    def add(fn: LossFn) -> LossFn:
        POLICY_LOSSES.register(name)(LossEntry(fn, params_cls, advantage_estimator))
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


def _finish(
    per_token: Tensor, inputs: PolicyLossInputs, p: ClipLossParams, metrics: Metrics
) -> tuple[Tensor, Metrics]:
    """Adds the optional KL penalty, aggregates, and fills the shared metrics."""
    mask = inputs.response_mask.float()
    if p.kl_beta > 0:
        if inputs.ref_logprob is None:
            raise ValueError("ref_logprob is required when kl_beta > 0")
        k3 = kl_k3(inputs.logprob.float(), inputs.ref_logprob.float())
        per_token = per_token + p.kl_beta * k3
        metrics["kl/ref_k3"] = _active_mean(k3, mask)
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


@_register("grpo", GrpoParams)
@_register("grpo_ds", ClipLossParams)
@_register("dapo", ClipLossParams)
def clip_policy_loss(inputs: PolicyLossInputs, p: ClipLossParams) -> tuple[Tensor, Metrics]:
    logprob, old, adv, mask = _prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    return _finish(per_token, inputs, p, metrics)


POLICY_LOSSES.register("dr_grpo")(LossEntry(clip_policy_loss, DrGrpoParams, "dr_grpo"))


@_register("stare", StareParams)
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


@_register("rsi_s", RsiParams)
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
        metrics["loss/policy"] = loss.detach()
        metrics["tokens/active"] = n_active.detach()
        return loss, metrics
    return _finish(per_token, inputs, p, metrics)


@_register("forking_8020", ForkingParams)
def forking_8020_loss(inputs: PolicyLossInputs, p: ForkingParams) -> tuple[Tensor, Metrics]:
    if inputs.entropy is None:
        raise ValueError("forking_8020 needs inputs.entropy (per-token entropy of the current pass)")
    logprob, old, adv, mask = _prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    keep = top_entropy_mask(inputs.entropy, mask, top_ratio=p.top_entropy_ratio)
    metrics["forking/kept_ratio"] = _active_mean(keep, mask)
    return _finish(per_token * keep, inputs, p, metrics)


@_register("clip_cov", ClipCovParams)
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


@_register("kl_cov", KlCovParams)
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


# --------------------------------------------------------------------------- entry points


def make_loss_params(name: str, **overrides: Any) -> ClipLossParams:
    """The named loss's parameters with overrides; an unknown parameter is an error naming it."""
    entry = POLICY_LOSSES.get(name)
    known = {f.name for f in dataclasses.fields(entry.params_cls)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) for loss {name!r}: {', '.join(unknown)}; valid: {', '.join(sorted(known))}"
        )
    return entry.params_cls(**overrides)


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
