"""The rollout engine's log-prob mismatch with the trainer, and its truncated importance-sampling correction.

An engine other than the policy itself (vLLM) samples with its own kernels from its own copy of the
weights, so the probability it gave a sampled token, π_sampler(y_t), differs from the trainer's π_old(y_t)
(scored before the update, `trainer.policy.update.measure_old_policy`). Per step, over the sampled tokens:
- `rollout/mismatch_abs_mean`, `rollout/mismatch_abs_max`: |log π_sampler − log π_trainer|;
- `rollout/mismatch_kl`: KL(π_sampler ‖ π_trainer) by the k3 estimator, mean of r − 1 − log r with
  r = π_trainer/π_sampler. The tokens are drawn from π_sampler, so E[r] = 1 and the estimate is unbiased
  for the KL and never negative (k1, the mean of −log r, is unbiased too but can be negative per batch).
- with rollout.tis_cap = C, the truncated importance weight w_t = min(r_t, C), which scales token t's
  advantage in the update (docs/ALGORITHMS.md, "Rollout mismatch");
- `entropy/sampler_gap`: a separate engine's entropy minus the trainer's H̄ over the same tokens (the entropy
  a law controls is the trainer's, docs/ALGORITHMS.md §12.3). The engine's is its mean surprisal
  −log π_sampler(y_t) on its own samples, an unbiased estimate of its entropy. HF generate samples with the
  trainer's own model and weights (its record agrees with the trainer's forward to 1e-6 relative), so there
  is no gap to report, and the metric's presence never depends on which rows took a forward.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from trainer.distributed.runtime import Reduce


def truncated_is_weights(trainer_logprob: Tensor, sampler_logprob: Tensor, cap: float) -> Tensor:
    """(B, R) w = min(π_trainer/π_sampler, cap), detached; computed in log space so no ratio overflows."""
    log_ratio = (trainer_logprob.detach() - sampler_logprob.detach()).float()
    return torch.exp(torch.clamp(log_ratio, max=math.log(cap)))


def weighted_advantages(advantages: Tensor, weights: Tensor) -> Tensor:
    """(B, R) per-token advantages Â_i · w_t. For the clipped surrogate, max(−Â ρ, −Â clip(ρ)) with Â scaled
    by w ≥ 0 is w times the token's loss (both branches are linear in Â), so this is the token's loss × w."""
    per_row = advantages.reshape(advantages.shape[0], -1)
    return per_row * weights if per_row.shape[1] > 1 else per_row[:, :1] * weights


def mismatch_metrics(
    sampler_logprob: Tensor, trainer_logprob: Tensor, mask: Tensor, reduce: Reduce, cap: float | None
) -> dict[str, float]:
    """The step's rollout/ metrics over every process's sampled tokens (mask (B, R) 1 on them)."""
    m = mask.bool()
    delta = (sampler_logprob.detach().float() - trainer_logprob.detach().float())[m]  # log p_s − log p_t
    log_r = -delta
    k3 = torch.expm1(log_r) - log_r
    sums = [float(delta.abs().sum()), float(k3.sum()), float(m.sum())]
    weights = None
    if cap is not None:
        weights = truncated_is_weights(trainer_logprob, sampler_logprob, cap)[m]
        sums += [float(weights.sum()), float((log_r > math.log(cap)).sum())]
    totals = reduce(sums, "sum", torch.float64)
    peak = reduce([float(delta.abs().max()) if delta.numel() else 0.0], "max", torch.float64)
    n = max(float(totals[2]), 1.0)
    metrics = {
        "rollout/mismatch_abs_mean": float(totals[0]) / n,
        "rollout/mismatch_abs_max": float(peak[0]),
        "rollout/mismatch_kl": float(totals[1]) / n,
    }
    if weights is not None:
        metrics["rollout/tis_weight_mean"] = float(totals[3]) / n
        metrics["rollout/tis_capped_fraction"] = float(totals[4]) / n
    return metrics


def corrected_advantages(
    advantages: Tensor, sampler_logprob: Tensor | None, trainer_logprob: Tensor | None, cap: float | None
) -> Tensor:
    """The update's advantages: with rollout.tis_cap, each token's scaled by its truncated importance weight
    min(π_trainer/π_sampler, C); without a cap, or without both log-probs, unchanged."""
    if cap is None or sampler_logprob is None or trainer_logprob is None:
        return advantages
    return weighted_advantages(advantages, truncated_is_weights(trainer_logprob, sampler_logprob, cap))


def step_mismatch_metrics(
    batch: Any,
    trainer_logprob: Tensor | None,
    reduce: Reduce,
    cap: float | None,
    trainer_entropy: Tensor | None = None,
) -> dict[str, float]:
    """`mismatch_metrics` of a rollout batch whose engine recorded its own log-probs (`sampler_logprob`, vLLM)
    over its response tokens, none where it did not (HF generate) or π_trainer is not known yet; and the
    sampler's entropy gap where the sampler's numbers are not π_old's own."""
    metrics = {}
    if batch.sampler_logprob is not None and trainer_logprob is not None:
        metrics = mismatch_metrics(batch.sampler_logprob, trainer_logprob, batch.response_mask, reduce, cap)
    if trainer_entropy is not None:
        metrics.update(sampler_entropy_gap(batch, trainer_entropy, reduce))
    return metrics


def sampler_entropy_gap(batch: Any, trainer_entropy: Tensor, reduce: Reduce) -> dict[str, float]:
    """{entropy/sampler_gap}: a separate engine's entropy − the trainer's, token means over every process's
    response tokens; {} where no separate engine sampled (HF generate: the trainer's own model)."""
    if batch.sampler_logprob is None:
        return {}
    sampler = -batch.sampler_logprob.detach().float()  # its mean surprisal estimates its entropy
    m = batch.response_mask.float()
    totals = reduce(
        [float((sampler * m).sum()), float((trainer_entropy.detach().float() * m).sum()), float(m.sum())],
        "sum",
        torch.float64,
    )
    n = max(float(totals[2]), 1.0)
    return {"entropy/sampler_gap": (float(totals[0]) - float(totals[1])) / n}
