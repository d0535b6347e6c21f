"""Reduce a per-token loss (B, T) to a scalar, independently of how the optimiser step is split.

Modes (ALGORITHMS.md §4):
- token-mean: Σ loss·m / N, N = active tokens of the whole optimiser step, across micro-batches and
  processes (DAPO). Each micro-batch contributes its share; their sum is the step loss, so splitting the
  same batch differently never changes the loss or its gradient.
- seq-mean-token-mean: mean over responses of each response's token mean (GRPO), divided by the number of
  responses of the whole step.
- seq-mean-token-sum-norm: Σ loss·m / (G · L_max), G = responses of the whole step, L_max the generation
  budget (Dr.GRPO; TRL's dr_grpo normaliser; verl divides by L only, which makes the scale depend on the
  micro-batch size).

Under DDP, gradients are averaged over processes: a caller that passes global counts must multiply the
local loss by the number of processes before backward so that the average equals the global sum.
"""

from __future__ import annotations

import torch
from torch import Tensor

from contract.hyperparams import AggMode, parse_agg_mode


def aggregate(
    per_token: Tensor,
    response_mask: Tensor,
    mode: str | AggMode,
    *,
    global_token_count: float | None = None,
    global_sequence_count: float | None = None,
    max_response_length: int | None = None,
) -> Tensor:
    """per_token, response_mask: (B, T). Global counts default to this batch's own (one micro-batch)."""
    mode = parse_agg_mode(mode)
    mask = response_mask.to(per_token.dtype)
    masked = per_token * mask
    if mode is AggMode.TOKEN_MEAN:
        denom = mask.sum() if global_token_count is None else torch.tensor(float(global_token_count))
        return masked.sum() / denom.clamp_min(1.0)
    n_seq = (
        torch.tensor(float(per_token.shape[0]))
        if global_sequence_count is None
        else torch.tensor(float(global_sequence_count))
    ).clamp_min(1.0)
    if mode is AggMode.SEQ_MEAN_TOKEN_MEAN:
        per_seq = masked.sum(-1) / mask.sum(-1).clamp_min(1.0)  # (B,)
        return per_seq.sum() / n_seq
    length = per_token.shape[-1] if max_response_length is None else max_response_length
    if length < 1:
        raise ValueError(f"max_response_length must be ≥ 1, got {length}")
    return masked.sum() / (n_seq * float(length))
