"""A training step's event metrics beyond the loss's (the engine adds the controllers' and the grader's):
π_old's quadrant table and the entropy against its band, rewards, response lengths, the optimiser and the
step's timings. Every figure is over the step batch of every process where the key says so (docs/metrics.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from contract.metrics import BandState
from trainer.algos import quadrant_analysis
from trainer.distributed.runtime import Reduce
from trainer.envs.tool_use import reduced_tool_metrics
from trainer.rollout.batch import Rollout, reflection_rate


@dataclass(frozen=True)
class StepCounts:
    """The step's global token and sequence counts, its generation batches, and the steps out of band so far
    (this one included)."""

    tokens: float
    sequences: float
    gen_batches: int
    steps_out_of_band: int


def step_metrics(
    batch: Rollout,
    advantages: Tensor,
    old: tuple[Tensor, Tensor, Tensor],
    h_bar: float,
    band: tuple[float, float],
    counts: StepCounts,
    reduce: Reduce,
    *,
    timings: tuple[float, float, float],
    grad_norm: float,
    lr: float,
) -> dict[str, float]:
    """old: π_old's log-probabilities, entropies and surprisal corrections on the step batch; timings: the
    step's start (perf_counter), its generation and its update seconds."""
    t0, t_gen, t_update = timings
    logprob, entropy, correction = old
    quad = quadrant_analysis(
        advantages, logprob, entropy, correction, batch.response_mask, global_token_count=counts.tokens
    )
    metrics = {k: float(v) for k, v in quad.items()}
    lengths = batch.response_lengths
    elapsed = time.perf_counter() - t0
    tokens = float(reduce(float(batch.attention_mask.sum()), "sum", torch.float32))
    metrics.update(
        {
            "entropy/mean": h_bar,
            "entropy/band_low": band[0],
            "entropy/band_high": band[1],
            "entropy/band_state": float(BandState.of(h_bar, band[0], band[1]).code),
            "entropy/steps_out_of_band": float(counts.steps_out_of_band),
            "reward/mean": float(batch.rewards.mean()) if batch.size else 0.0,
            "reward/std": float(batch.rewards.std()) if batch.size > 1 else 0.0,
            "reward/accuracy": float(batch.correct.mean()) if batch.size else 0.0,
            "response/length_mean": float(lengths.mean()) if batch.size else 0.0,
            "response/length_max": float(lengths.max()) if batch.size else 0.0,
            "response/truncated_fraction": float(batch.truncated.float().mean()) if batch.size else 0.0,
            "response/reflection_rate": reflection_rate(batch.texts),
            "actor/grad_norm": grad_norm,
            "actor/lr": lr,
            "perf/step_seconds": elapsed,
            "perf/generation_seconds": t_gen,
            "perf/update_seconds": t_update,
            "perf/tokens_per_second": tokens / max(elapsed, 1e-9),
            "perf/gen_batches": float(counts.gen_batches),
            "data/responses": counts.sequences,
        }
    )
    if batch.tool_counts is not None:
        metrics.update(reduced_tool_metrics(batch.tool_counts, reduce))
    return metrics
