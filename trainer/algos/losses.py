"""Policy losses: one registry, one signature, `(inputs, params, control) → (loss, metrics)`.

Every loss builds a per-token loss (B, T) on the clipped surrogate of surrogate.py, then reduces it with
`aggregation.aggregate`. `control` is the state of the algorithm's per-step controller, passed by the
caller (None for the losses without one, which refuse any other value: `control.check_control`).

Registered losses (ALGORITHMS.md §4–6):
- grpo: ε 0.2/0.2, seq-mean-token-mean, optional β·k3 to a reference policy.
- grpo_ds: ε 0.2/0.28, dual clip c = 10, token-mean (STARE's controlled baseline, STARE with ω ≡ 1).
- dapo: the grpo_ds loss; DAPO's soft overlong penalty is reward shaping (see shaping.py).
- dr_grpo: ε 0.2/0.2, seq-mean-token-sum-norm (pair it with the dr_grpo advantage).
- stare: ω · (grpo_ds per-token loss), in stare.py with its gate and its token weights.
- rsi_s: grpo_ds per-token loss on RSI-kept tokens only, in rsi.py.
- forking_8020: loss on the top 20 % entropy tokens only; the denominator counts all active tokens.
- clip_cov: random max(1, ⌊r·N⌋) tokens with 1 < cov < 5 that are not already clipped lose their gradient.
- kl_cov: the top max(1, ⌊κ·N⌋) tokens by cov get −Âρ + coef·|ℓ_θ − ℓ_old|; others −Âρ (unclipped).
- adaptive_entropy: grpo_ds per-token loss − α·H_t, α adapted toward a target entropy each step
  (Skywork-OR1's adaptive entropy control; its controller, whose state is `control`, is declared in
  contract/control/entropy_coef.py).

Deliberate departures and choices:
- clip_cov/kl_cov use ε 0.2/0.2 and token-mean by default, as in the Entropy-Mechanism recipes on verl.
- Metrics are 0-d detached tensors, each a mean over the scope's active tokens (so micro-batch values
  combine exactly when weighted by `tokens/active`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from contract.algorithms import make_loss_params as _make_params
from contract.algorithms import zero_advantage_rows_inert
from contract.control.entropy_coef import EntropyCoefState
from contract.hyperparams import (
    AdaptiveEntropyParams,
    ClipCovParams,
    ClipLossParams,
    ForkingParams,
    KlCovParams,
    StareParams,
)
from trainer.algos import pi_control, rsi, split_control, stare  # noqa: F401  (they register their losses)
from trainer.algos.control import check_control, register_actuator
from trainer.algos.selection import (
    floor_count,
    random_subset_mask,
    token_covariance,
    top_entropy_mask,
    top_k_mask,
)
from trainer.algos.surrogate import (
    POLICY_LOSSES,
    LossEntry,
    Metrics,
    PolicyLossInputs,
    active_mean,
    clipped_surrogate,
    finish,
    importance_ratio,
    prepare,
    register_loss,
)

__all__ = [
    "POLICY_LOSSES",
    "ClipLossParams",
    "LossEntry",
    "PolicyLossInputs",
    "StareParams",
    "compute_policy_loss",
    "make_loss_params",
    "zero_advantage_rows_inert",
]


@register_loss("grpo")
@register_loss("grpo_ds")
@register_loss("dapo")
@register_loss("dr_grpo")
def clip_policy_loss(
    inputs: PolicyLossInputs, p: ClipLossParams, control: Any = None
) -> tuple[Tensor, Metrics]:
    logprob, old, adv, mask = prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    return finish(per_token, inputs, p, metrics)


@register_loss("forking_8020")
def forking_8020_loss(
    inputs: PolicyLossInputs, p: ForkingParams, control: Any = None
) -> tuple[Tensor, Metrics]:
    if inputs.entropy is None:
        raise ValueError("forking_8020 needs inputs.entropy (per-token entropy of the current pass)")
    logprob, old, adv, mask = prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    keep = top_entropy_mask(inputs.entropy, mask, top_ratio=p.top_entropy_ratio)
    metrics["forking/kept_ratio"] = active_mean(keep, mask)
    return finish(per_token * keep, inputs, p, metrics)


@register_loss("clip_cov")
def clip_cov_loss(inputs: PolicyLossInputs, p: ClipCovParams, control: Any = None) -> tuple[Tensor, Metrics]:
    logprob, old, adv, mask = prepare(inputs)
    per_token, metrics, already_clipped = clipped_surrogate(logprob, old, adv, mask, p)
    cov = token_covariance(adv, logprob, mask)
    active = mask.bool()
    window = active & ~already_clipped & (cov > p.cov_lower) & (cov < p.cov_upper)
    k = floor_count(active.sum(), p.clip_cov_ratio).clamp(min=1)
    zeroed = random_subset_mask(window, k, inputs.generator)
    per_token = per_token * (~zeroed)
    metrics["clip_cov/zeroed_fraction"] = active_mean(zeroed, mask)
    metrics["clip_cov/window_fraction"] = active_mean(window, mask)
    return finish(per_token, inputs, p, metrics)


@register_loss("kl_cov")
def kl_cov_loss(inputs: PolicyLossInputs, p: KlCovParams, control: Any = None) -> tuple[Tensor, Metrics]:
    logprob, old, adv, mask = prepare(inputs)
    _, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)  # metrics only: kl_cov is unclipped
    ratio = importance_ratio(logprob, old)
    cov = token_covariance(adv, logprob, mask)
    active = mask.bool()
    k = floor_count(active.sum(), p.kl_cov_ratio).clamp(min=1)
    penalised = top_k_mask(cov, active, k)
    per_token = -adv * ratio + torch.where(
        penalised, p.kl_cov_coef * (logprob - old).abs(), torch.zeros_like(ratio)
    )
    metrics["kl_cov/penalised_fraction"] = active_mean(penalised, mask)
    return finish(per_token, inputs, p, metrics)


@register_actuator("entropy_coef")
@register_loss("adaptive_entropy")
def adaptive_entropy_loss(
    inputs: PolicyLossInputs, p: AdaptiveEntropyParams, control: EntropyCoefState | None = None
) -> tuple[Tensor, Metrics]:
    """grpo_ds per-token loss − α·H_t, α = `control.applied` (the controller's state; None: α = 0). H_t must
    carry its gradient (kernels' entropy_grad) when α > 0."""
    if inputs.entropy is None:
        raise ValueError("adaptive_entropy needs inputs.entropy (per-token entropy of the current pass)")
    coef = control.applied if control is not None else 0.0
    logprob, old, adv, mask = prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    if coef > 0:
        if not inputs.entropy.requires_grad and torch.is_grad_enabled() and logprob.requires_grad:
            raise ValueError("adaptive_entropy with coef > 0 needs a differentiable entropy")
        per_token = per_token - coef * inputs.entropy
    metrics["entropy_bonus/coef"] = torch.tensor(float(coef))
    return finish(per_token, inputs, p, metrics)


# --------------------------------------------------------------------------- entry points


def make_loss_params(name: str, **overrides: Any) -> ClipLossParams:
    """The named loss's parameters with overrides; an unknown parameter is an error naming it."""
    POLICY_LOSSES.get(name)  # unknown names fail with the registry's message
    return _make_params(name, **overrides)


def compute_policy_loss(
    name: str,
    inputs: PolicyLossInputs,
    params: ClipLossParams | None = None,
    *,
    control: Any = None,
    **overrides: Any,
) -> tuple[Tensor, Metrics]:
    """The loss `name` of one micro-batch. `control`: the state of the algorithm's controller this step
    (`stare.StareControllerState`, `entropy_control.EntropyCoefState`), checked (type and bounds) here;
    None: its initial state. A loss without a controller refuses a control; an override that names no
    parameter is an error."""
    entry = POLICY_LOSSES.get(name)
    check_control(name, control)
    if params is None:
        params = make_loss_params(name, **overrides)
    elif overrides:
        known = {f.name for f in dataclasses.fields(params)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown parameter(s) for loss {name!r}: {', '.join(unknown)}")
        params = dataclasses.replace(params, **overrides)
    if not isinstance(params, entry.params_cls):
        raise ValueError(
            f"params for loss {name!r} must be {entry.params_cls.__name__}, got {type(params).__name__}"
        )
    return entry.fn(inputs, params, control)
