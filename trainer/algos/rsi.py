"""RSI-S in one place: the Relative Surprisal Index, its keep mask and its loss (a reconstruction,
ALGORITHMS.md §6). Parameters: `RsiParams`, defined with the other algorithms' in contract.hyperparams.

- RSI_t = s_t / max(H_t, eps), s = −log π(token), H the entropy of the same distribution.
- keep: active tokens with r_lo ≤ RSI ≤ r_hi ("fixed"), or between the r_lo/r_hi quantiles of the
  scope's RSI values ("quantile", r_lo/r_hi then quantile levels in [0, 1]).
- loss: the grpo_ds per-token loss on kept tokens only; the denominator counts all active tokens ("all")
  or the kept ones ("kept").

Departure: with denominator "kept" the loss divides by the kept count of the scope it is given (a
micro-batch), then scales by that scope's share of the step's active tokens; only "all" is exactly
invariant to micro-batch splitting.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from contract.hyperparams import RsiParams
from trainer.algos.surrogate import (
    Metrics,
    PolicyLossInputs,
    aggregate_step,
    clipped_surrogate,
    finish,
    kl_penalty,
    prepare,
    register_loss,
)

__all__ = ["BOUND_MODES", "RsiParams", "relative_surprisal_index", "rsi_keep_mask", "rsi_s_loss"]

BOUND_MODES = ("fixed", "quantile")


def relative_surprisal_index(surprisal: Tensor, entropy: Tensor, *, eps: float = 1e-6) -> Tensor:
    """RSI = s / max(H, eps)."""
    return surprisal / entropy.clamp_min(eps)


def rsi_keep_mask(
    surprisal: Tensor,
    entropy: Tensor,
    response_mask: Tensor,
    *,
    mode: str,
    low: float,
    high: float,
    eps: float = 1e-6,
) -> tuple[Tensor, Metrics]:
    """Keeps active tokens with low ≤ RSI ≤ high ("fixed") or between the low/high quantiles of the
    scope's RSI values ("quantile", where low/high are quantile levels in [0, 1]). Any other mode is a
    ValueError."""
    if mode not in BOUND_MODES:
        raise ValueError(f"mode must be one of {', '.join(BOUND_MODES)}, got {mode!r}")
    active = response_mask.bool()
    rsi = relative_surprisal_index(surprisal.detach().float(), entropy.detach().float(), eps=eps)
    n_active = active.sum().clamp_min(1).to(torch.float32)
    values = rsi[active]
    if mode == "quantile" and values.numel() > 0:
        q = torch.quantile(values.double(), torch.tensor([low, high], dtype=torch.float64, device=rsi.device))
        lo_bound, hi_bound = q[0].float(), q[1].float()
    else:
        lo_bound = torch.tensor(low, dtype=torch.float32, device=rsi.device)
        hi_bound = torch.tensor(high, dtype=torch.float32, device=rsi.device)
    below = active & (rsi < lo_bound)
    above = active & (rsi > hi_bound)
    keep = active & ~below & ~above
    mean = values.mean() if values.numel() else rsi.new_zeros(())
    std = values.std(unbiased=False) if values.numel() else rsi.new_zeros(())
    return keep, {
        "rsi/kept_ratio": keep.sum() / n_active,
        "rsi/dropped_low_fraction": below.sum() / n_active,
        "rsi/dropped_high_fraction": above.sum() / n_active,
        "rsi/mean": mean,
        "rsi/std": std,
    }


@register_loss("rsi_s")
def rsi_s_loss(inputs: PolicyLossInputs, p: RsiParams, control: Any = None) -> tuple[Tensor, Metrics]:
    """grpo_ds per-token loss on RSI-kept tokens; no controller (`control` is unused)."""
    if inputs.entropy is None:
        raise ValueError("rsi_s needs inputs.entropy (per-token entropy of the current pass)")
    logprob, old, adv, mask = prepare(inputs)
    per_token, metrics, _ = clipped_surrogate(logprob, old, adv, mask, p)
    keep, rsi_metrics = rsi_keep_mask(
        -logprob.detach(), inputs.entropy, mask, mode=p.bound_mode, low=p.r_lo, high=p.r_hi, eps=p.entropy_eps
    )
    metrics.update(rsi_metrics)
    per_token = per_token * keep
    if p.denominator != "kept":
        return finish(per_token, inputs, p, metrics)
    n_active = mask.sum()
    n_kept = keep.sum().to(torch.float32)
    share = n_active / (
        torch.tensor(float(inputs.global_token_count)) if inputs.global_token_count is not None else n_active
    ).clamp_min(1.0)
    loss = (per_token * mask).sum() / n_kept.clamp_min(1.0) * share
    penalty = kl_penalty(inputs, p, metrics)
    if penalty is not None:  # the KL term is not RSI-masked: normalised as in the "all" mode
        loss = loss + aggregate_step(penalty, inputs, p)
    metrics["loss/policy"] = loss.detach()
    metrics["tokens/active"] = n_active.detach()
    return loss, metrics
