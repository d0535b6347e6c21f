"""The update: π_old on the step batch (`measure_old_policy`) and the micro-batched forward/backward of the
policy loss (`policy_update`), with the optimisations that leave its numbers as they are.

π_old has one documented path and optimisations giving the same numbers (docs/ALGORITHMS.md §4.14;
tests/trainer/test_update.py checks each on fixed inputs: bit for bit where the arithmetic is the same, up
to float rounding where the matmul shapes differ):
- the path: a forward without autograd over the step batch, micro-batch by micro-batch, before the update
  (`no_grad_pass`); where nothing reads π_old before the update, the first training pass stands in for it
  (on-policy, π_old = π_θ until the optimiser step: `OldPolicy.fill`);
- one pass: on-policy, one micro-batch on every process, no dropout: the training forward runs first and
  is π_old, and the loss is taken on the same graph;
- the sampling record: on-policy, π_old is the sampling policy, whose numbers generation recorded
  (`reads_sample_stats`);
- the zero-advantage skip (`zero_advantage_skip`): rows with Â = 0 are scored without autograd.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from contract import algorithms
from contract.spec import TrainSpec
from trainer.algos import compute_policy_loss
from trainer.algos.losses import PolicyLossInputs
from trainer.distributed.runtime import Reduce, Runtime
from trainer.distributed.strategy import PromptSharing
from trainer.policy.scoring import micro_batches, prompts_shareable, response_stats
from trainer.rollout.batch import Rollout

LR_SCHEDULES = ("constant", "linear", "cosine")
Stats = tuple[Tensor, Tensor | None, Tensor | None]


class NonFiniteError(RuntimeError):
    def __init__(self, step: int, what: str) -> None:
        self.step = step
        super().__init__(f"non-finite {what} at step {step}")


def lr_factor(schedule: str, step: int, *, warmup_steps: int, steps: int) -> float:
    """Multiplier of optim.lr at scheduler step `step`: linear warm-up over warmup_steps, then constant,
    linear decay to 0 or cosine decay to 0 at `steps`."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(LR_SCHEDULES)}, got {schedule!r}")
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, steps - warmup_steps))
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclasses.dataclass
class StepBatch:
    """What the update needs for one optimiser step on this process."""

    rollout: Rollout
    advantages: Tensor  # (B,)
    old_logprob: Tensor | None  # (B, R) or None when on-policy
    ref_logprob: Tensor | None
    token_weights: Tensor | None  # STARE ω over the step batch (step scope)
    global_tokens: float
    global_sequences: float
    skip_rows: Tensor | None = None  # (B,) bool: the zero-advantage skip's rows (None: none)
    share_prompts: bool | None = None  # the forward path of every micro-batch (micro_batch_plan)


@dataclasses.dataclass(frozen=True)
class LossSetup:
    """The loss of one step: its name, parameters, the controller's state, and the metric names the
    controller owns (left out of the loss's metrics, so each metric of the step has one writer)."""

    name: str
    params: Any
    control: Any = None
    entropy_grad: bool = False  # the loss has an entropy term: the training entropy carries its gradient
    controller_metrics: frozenset[str] = frozenset()


def policy_update(
    model: torch.nn.Module,
    runtime: Runtime,
    batch: StepBatch,
    loss: LossSetup,
    *,
    temperature: float,
    micro_batch_size: int,
    max_response_length: int,
    num_micro_batches: int | None = None,
    nan_injection: bool = False,
    step: int = 0,
    first_pass: Stats | None = None,
) -> tuple[dict[str, float], Tensor, Tensor, Tensor]:
    """Forward/backward over micro-batches with step-global normalisers; no optimiser step here.

    Returns (token-weighted metrics, logprob, entropy, correction) of the training pass. Every process runs
    the same number of micro-batches (padded with zero-weight ones), each with the same forward calls
    (`batch.share_prompts`), so gradient synchronisation never hangs (`micro_batch_plan`).
    `first_pass`: response_stats of micro-batch 0, already run with grad (the one-pass path).
    """
    r = batch.rollout
    rows = micro_batches(r.size, micro_batch_size)
    total = num_micro_batches if num_micro_batches is not None else len(rows)
    sums: dict[str, float] = {}
    weight_total = 0.0
    logprobs = torch.zeros_like(r.response_mask)
    entropies = torch.zeros_like(r.response_mask)
    corrections = torch.zeros_like(r.response_mask)
    for i in range(total):
        padding = i >= len(rows)
        idx = rows[0][:1] if padding else rows[i]
        ctx = contextlib.nullcontext() if i == total - 1 else runtime.no_sync(model)
        with ctx:
            stats = first_pass if i == 0 and first_pass is not None else None
            (logprob, entropy, correction), metrics = _micro_batch(
                model, runtime, batch, loss, idx, stats, padding=padding, temperature=temperature,
                max_response_length=max_response_length, nan_injection=nan_injection, step=step,
            )  # fmt: skip
        if padding:
            continue
        logprobs[idx] = logprob.detach()
        assert entropy is not None and correction is not None
        entropies[idx] = entropy.detach()
        corrections[idx] = correction
        w = float(metrics["tokens/active"])
        weight_total += w
        for key, value in metrics.items():
            if key == "tokens/active" or key in loss.controller_metrics:
                continue
            if key == "loss/policy":
                sums[key] = sums.get(key, 0.0) + float(value)  # shares of the step loss add up
            else:
                sums[key] = sums.get(key, 0.0) + float(value) * w
    merged = {k: (v if k == "loss/policy" else v / max(weight_total, 1.0)) for k, v in sums.items()}
    return merged, logprobs, entropies, corrections


def _micro_batch(
    model: torch.nn.Module,
    runtime: Runtime,
    batch: StepBatch,
    loss_setup: LossSetup,
    idx: Tensor,
    stats: Stats | None,
    *,
    padding: bool,
    temperature: float,
    max_response_length: int,
    nan_injection: bool,
    step: int,
) -> tuple[Stats, dict[str, Tensor]]:
    """One micro-batch's forward (unless `stats` holds it), loss and backward."""
    r = batch.rollout
    if stats is None:
        skip_rows = batch.skip_rows[idx] if batch.skip_rows is not None else None
        stats = response_stats(
            model, r, idx, temperature, with_entropy=True, skip_rows=skip_rows,
            entropy_grad=loss_setup.entropy_grad, share_prompts=batch.share_prompts,
        )  # fmt: skip
    logprob, entropy, _ = stats
    # A padding micro-batch (a process with fewer rows than another) computes a real row's loss and then
    # scales it by 0: its backward has the graph of any other micro-batch, so every process runs the same
    # collectives (DDP's bucket all-reduces, FSDP2's per-layer all-gathers and reduce-scatters), with zero
    # gradients. (A zeroed mask instead left FSDP2's backward on the two processes out of step: a hang.)
    mask = r.response_mask[idx]
    old = batch.old_logprob[idx] if batch.old_logprob is not None else logprob.detach()
    inputs = PolicyLossInputs(
        logprob=logprob,
        old_logprob=old,
        advantages=batch.advantages[idx],
        response_mask=mask,
        entropy=entropy,
        ref_logprob=batch.ref_logprob[idx] if batch.ref_logprob is not None else None,
        token_weights=batch.token_weights[idx] if batch.token_weights is not None else None,
        global_token_count=batch.global_tokens,
        global_sequence_count=batch.global_sequences,
        max_response_length=max_response_length,
    )
    loss, metrics = compute_policy_loss(
        loss_setup.name, inputs, loss_setup.params, control=loss_setup.control
    )
    if padding:
        loss = loss * 0.0
    if nan_injection:
        loss = loss * float("nan")
    if not torch.isfinite(loss):
        raise NonFiniteError(step, "loss")
    # DDP averages gradients over processes; the local loss is a share of the global sum. A loss without a
    # graph comes from a micro-batch of skipped rows only (StepBatch.skip_rows).
    if loss.requires_grad:
        runtime.backward(loss * runtime.world_size)
    return stats, metrics


def micro_batch_plan(
    batch: Rollout, micro_batch_size: int, reduce: Reduce, *, sharing: PromptSharing
) -> tuple[int, bool | None]:
    """(micro-batches, share_prompts): how the update runs on this process, the same on every process (one
    all-reduce of host numbers: `reduce(values, "max", dtype)`).

    Micro-batches: the most of any process; a process with fewer rows pads with zero-weight micro-batches.
    share_prompts follows the strategy's `sharing` (Strategy.prompt_sharing): "rows" (one process) None,
    each call decides by its rows; "never" (DDP over several processes: each call syncs buffers) False;
    "agreed", where the model is sharded (FSDP2 over several processes): each forward
    call of a sharded layer all-gathers its weights and its backward reduce-scatters the gradients, so every
    process must make the same forward calls in each micro-batch. `response_logits` left to itself runs a
    group's shared prompt once (two calls) only where the micro-batch's rows share one: a padding
    micro-batch (one row: one call) or rows of distinct prompts then met another process's two calls, and
    the processes' backwards went out of step (the hang of fsdp2 over more than one micro-batch). So under
    sharding every micro-batch takes the shared-prompt path, or, where some process's batch has no room for
    it (scoring.prompts_shareable), none does.
    """
    width = batch.input_ids.shape[1]
    unshareable = not prompts_shareable(batch.prompt_length, width)
    plan = reduce([len(micro_batches(batch.size, micro_batch_size)), int(unshareable)], "max", torch.int64)
    share = {"rows": None, "never": False, "agreed": not bool(plan[1])}[sharing]
    return int(plan[0]), share


# ------------------------------------------------------------------------------------------ π_old


def zero_advantage_skip(advantages: Tensor) -> Tensor | None:
    """The zero-advantage skip: (B,) bool, the rows the update scores without autograd; None: none.

    Rows whose advantage is exactly 0 (every group with equal rewards, under GRPO's estimators) receive no
    gradient from a loss whose zero-advantage rows are inert (`zero_advantage_rows_inert`), so the update
    scores them without autograd (`response_stats`'s skip_rows): same loss, metrics and gradient, less work
    (docs/BENCHMARKS.md). At least one row keeps autograd, so the backward still runs and every parameter
    that takes part gets its (zero) gradient as without the skip: AdamW then moves exactly the same
    parameters. The engine applies it where `Engine.skip_zero_advantage` holds.
    """
    if advantages.numel() == 0:
        return None
    skip = advantages.reshape(advantages.shape[0], -1).eq(0).all(dim=1)
    if not bool(skip.any()):
        return None
    if bool(skip.all()):
        skip[0] = False
    return skip


def reads_sample_stats(
    spec: TrainSpec, *, skip_zero_advantage: bool, deterministic: bool, world: int
) -> bool:
    """Whether rollouts record the sample stats: each token's log-prob, entropy and C under the sampling
    policy, taken during generation (`rollout(sample_stats=True)`), which the update then reads in place of
    a forward (docs/BENCHMARKS.md). It reads them for the zero-advantage skip's rows, and as π_old of
    on-policy STARE (or the adaptive entropy bonus) over more than one micro-batch (`measure_old_policy`;
    one micro-batch takes π_old from its training forward). Generation runs in eval mode, so only where the
    training forward has no dropout (`deterministic`) are they the same numbers, up to float rounding.
    """
    o = spec.optim
    rows_per_process = -(-o.prompts_per_step // world) * spec.sampling.group_size
    old_policy_read = (
        algorithms.get(spec.algorithm.name).measures_entropy_first
        and o.ppo_epochs == 1
        and rows_per_process > o.micro_batch_size
    )
    return deterministic and (skip_zero_advantage or old_policy_read)


@dataclasses.dataclass
class OldPolicy:
    """π_old on the step batch, per token (B, R): the policy that sampled it, the weights before this step's
    update. Read by the controllers, STARE's step-scope ranking, the ratio and the step's metrics."""

    logprob: Tensor | None = None
    entropy: Tensor | None = None
    correction: Tensor | None = None
    # log π_old for the loss's ratio; None: the training pass's own log-probs (on-policy: ratio 1)
    ratio_logprob: Tensor | None = None
    # the training forward π_old was read from, graph and all (the one-pass path): the update's first pass
    first_pass: tuple[Tensor, Tensor | None, Tensor | None] | None = None

    def fill(self, logprob: Tensor, entropy: Tensor, correction: Tensor) -> None:
        """Where nothing read π_old before the update, the first training pass is π_old (on-policy)."""
        if self.entropy is None:
            self.logprob, self.entropy, self.correction = logprob, entropy, correction


def measure_old_policy(
    model: torch.nn.Module,
    batch: Rollout,
    skip_rows: Tensor | None,
    *,
    spec: TrainSpec,
    n_micro: int,
    deterministic: bool,
    entropy_grad: bool,
    full_weights: Callable[[torch.nn.Module], contextlib.AbstractContextManager[Any]] | None = None,
    share_prompts: bool | None = None,
) -> OldPolicy:
    """π_old on the step batch, before the update, where something reads it then: a controller (H̄) or
    STARE's step-scope ranking (the algorithm's registration says `measures_entropy_first`), or the ratio of
    an off-policy update (ppo_epochs > 1). Otherwise an empty OldPolicy, which the first training pass fills.

    The documented path is `no_grad_pass`; the one-pass path and the sampling record are optimisations
    with the same numbers (see the module docstring), taken where they apply. `full_weights(model)`: the
    context the no-grad pass runs in (Strategy.full_weights: under fsdp2, full weights, so that processes
    with different numbers of micro-batches make no collective calls); the one-pass path is a training
    forward and runs sharded, on every process alike (`share_prompts`: its forward path, micro_batch_plan).
    """
    on_policy = spec.optim.ppo_epochs == 1
    measures_first = algorithms.get(spec.algorithm.name).measures_entropy_first
    if not (measures_first or not on_policy):
        return OldPolicy()
    temperature = spec.sampling.temperature
    if measures_first and on_policy and n_micro == 1 and deterministic:
        return one_pass(
            model, batch, skip_rows, temperature, entropy_grad=entropy_grad, share_prompts=share_prompts
        )
    if not batch.size:
        return OldPolicy()
    if on_policy and batch.has_sample_stats:
        return OldPolicy(batch.sample_logprob, batch.sample_entropy, batch.sample_correction)
    with full_weights(model) if full_weights is not None else contextlib.nullcontext(model) as full:
        return no_grad_pass(full, batch, temperature, spec.optim.micro_batch_size)


def one_pass(
    model: torch.nn.Module,
    batch: Rollout,
    skip_rows: Tensor | None,
    temperature: float,
    *,
    entropy_grad: bool,
    share_prompts: bool | None = None,
) -> OldPolicy:
    """The training forward over the whole batch (one micro-batch), with grad: π_old, and the update's first
    pass on the same graph."""
    first = response_stats(
        model,
        batch,
        torch.arange(batch.size),
        temperature,
        with_entropy=True,
        skip_rows=skip_rows,
        entropy_grad=entropy_grad,
        share_prompts=share_prompts,
    )
    entropy = first[1].detach() if first[1] is not None else None
    return OldPolicy(first[0].detach(), entropy, first[2], first_pass=first)


def no_grad_pass(
    model: torch.nn.Module, batch: Rollout, temperature: float, micro_batch_size: int
) -> OldPolicy:
    """π_old's documented path: a forward without autograd over the batch, micro-batch by micro-batch; its
    log-probs are then the ratio's π_old."""
    with torch.no_grad():
        parts = [
            response_stats(model, batch, idx, temperature, with_entropy=True)
            for idx in micro_batches(batch.size, micro_batch_size)
        ]
    logprob = torch.cat([p[0] for p in parts])
    entropy = torch.cat([p[1] for p in parts if p[1] is not None])
    correction = torch.cat([p[2] for p in parts if p[2] is not None])
    return OldPolicy(logprob, entropy, correction, ratio_logprob=logprob)


def check_finite_entropy(step: int, h_bar: float) -> float:
    if not math.isfinite(h_bar):
        raise NonFiniteError(step, "entropy")
    return h_bar
