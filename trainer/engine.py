"""The RL engine: a job spec in, a trained checkpoint, per-step events and an evaluation report out.

One optimiser step k (`Engine.train_step`):
  1. rollout: prompts from the data cursor, G samples each, verifier rewards (+ DAPO overlong shaping);
     with dynamic sampling, regenerate (≤ max_gen_batches) until the batch holds enough informative groups;
  2. advantages (registry), global token/sequence counts (all-reduced across processes), the rows of the
     zero-advantage skip (`zero_advantage_skip`);
  3. π_old on the step batch (`Engine.old_policy`, its one source): measured before the update where a
     controller or an off-policy ratio reads it, else the training pass's own numbers;
  4. the controllers' update from H̄ (token-mean entropy of π_old), once, before the update; their state
     is passed to the loss (`Engine.loss_control`);
  5. ppo_epochs × (micro-batched forward/backward with the step-global normalisers, one optimiser step);
  6. one event with every metric; checkpoint / evaluation at their intervals.
Each step reseeds the RNGs from (seed, step), so a resumed run repeats the uninterrupted one exactly.

Exit codes (contract.protocol.ExitCode, re-exported here): 0 done; 2 invalid spec or data (user error);
3 non-finite loss or entropy (the error names the step; the last checkpoint stays); 74 a write to the run
folder failed (disk full, read-only, I/O error: the `error` event carries code, errno and path; the
checkpoints written before stay, a half-written one is removed); 75 stopped by SIGTERM/SIGINT after writing
a checkpoint (resume with --resume); 1 anything else (a crash: the traceback is on stderr).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from torch import Tensor
from transformers import DynamicCache

from contract import algorithms
from contract.hyperparams import AdaptiveEntropyParams
from contract.metrics import BandState
from contract.protocol import CHECKPOINTS_DIR, EVENTS_FILE, ErrorCode, EventType, ExitCode
from contract.spec import SftSpec, TrainSpec
from contract.storage import UNAMBIGUOUS, StorageError, storage_writes
from trainer import checkpoints, heap
from trainer.algos import (
    compute_advantages,
    compute_policy_loss,
    informative_groups,
    make_loss_params,
    quadrant_analysis,
    stare,
    token_stats_from_logits,
    zero_advantage_rows_inert,
)
from trainer.algos.entropy_control import EntropyCoefState, initial_coef_state, update_coef
from trainer.algos.losses import PolicyLossInputs
from trainer.models import apply_lora, load_model_and_tokenizer
from trainer.report import write_report
from trainer.rollout import (
    Rollout,
    cache_argument,
    concat_rollouts,
    generate,
    hf_model,
    reflection_rate,
    rollout,
    run_episodes,
)
from trainer.tasks import Example, make_train_eval, render_prompt
from trainer.verifiers import score

EventCallback = Callable[[dict[str, Any]], None]
NAN_STEP_ENV = "STARE_INJECT_NAN_STEP"  # fault injection for tests: the loss at this step becomes NaN
STEP_DELAY_ENV = "STARE_STEP_DELAY_S"  # for fault tests: sleep this long after each step (a slow model)
CRASH_STEP_ENV = "STARE_INJECT_CRASH_STEP"  # fault injection for tests: this step raises (a trainer crash)


def _inject_crash(step: int) -> None:
    """Fault injection for the worker's tests: with STARE_INJECT_CRASH_STEP=k, step k raises (every attempt
    that reaches it: a crash loop)."""
    crash_step = os.environ.get(CRASH_STEP_ENV)
    if crash_step is not None and int(crash_step) == step:
        raise RuntimeError(f"injected crash at step {step} ({CRASH_STEP_ENV})")


class NonFiniteError(RuntimeError):
    def __init__(self, step: int, what: str) -> None:
        self.step = step
        super().__init__(f"non-finite {what} at step {step}")


class Interrupted(Exception):
    pass


# On resume, the events after the checkpoint (logged again) and those that ended the interrupted run go.
_STEP_EVENTS = frozenset({EventType.STEP, EventType.EVAL, EventType.CHECKPOINT})
_END_EVENTS = frozenset({EventType.FINISHED, EventType.ERROR, EventType.INTERRUPTED})


def _now() -> str:
    return datetime.now(UTC).isoformat()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7_919) % (2**63 - 1)


# ------------------------------------------------------------------------------------------ scoring pass


def response_stats(
    model: torch.nn.Module,
    batch: Rollout,
    index: Tensor,
    temperature: float,
    *,
    with_entropy: bool,
    skip_rows: Tensor | None = None,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Log-prob (grad if enabled), entropy and C of each response token of the rows `index`. (b, R).

    skip_rows: (b,) bool, the rows of the zero-advantage skip (`zero_advantage_skip`; None: none). With grad
    enabled they come back detached: read from the rollout's sample stats when it carries them (no forward
    at all), else from a second forward without autograd. The values are the same up to float rounding
    (other matmul shapes).
    entropy_grad: the entropy carries its gradient too (a loss with an entropy term); needs every row.
    """
    if skip_rows is not None and torch.is_grad_enabled() and bool(skip_rows.any()):
        keep = (~skip_rows).nonzero().squeeze(-1)
        rest = skip_rows.nonzero().squeeze(-1)
        detached: tuple[Tensor, Tensor | None, Tensor | None]
        if batch.sample_logprob is not None:
            assert batch.sample_entropy is not None and batch.sample_correction is not None
            rows = index[rest]
            detached = (
                batch.sample_logprob[rows],
                batch.sample_entropy[rows] if with_entropy else None,
                batch.sample_correction[rows] if with_entropy else None,
            )
        else:
            with torch.no_grad():
                detached = response_stats(model, batch, index[rest], temperature, with_entropy=with_entropy)
        if keep.numel() == 0:
            return detached
        attached = response_stats(model, batch, index[keep], temperature, with_entropy=with_entropy)
        order = torch.empty_like(index)
        order[torch.cat([keep, rest])] = torch.arange(index.numel(), device=index.device)
        joined = [
            None if a is None or d is None else torch.cat([a, d])[order] for a, d in zip(attached, detached)
        ]
        assert joined[0] is not None
        return joined[0], joined[1], joined[2]
    input_ids = batch.input_ids[index]
    logits = response_logits(
        model, input_ids, batch.attention_mask[index], batch.position_ids()[index], batch.prompt_length
    )
    stats = token_stats_from_logits(
        logits,
        input_ids[:, batch.prompt_length :],
        temperature=temperature,
        with_entropy=with_entropy,
        with_correction=with_entropy,
        entropy_grad=entropy_grad and torch.is_grad_enabled(),
        # The logits are this function's own intermediate: backward may write their gradient over them
        # instead of allocating another (rows, R, V) tensor (its size for a large model: docs/BENCHMARKS.md).
        grad_in_logits=torch.is_grad_enabled(),
    )
    return stats.logprob, stats.entropy, stats.correction


def response_logits(
    model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, p_len: int
) -> Tensor:
    """(b, R, V) logits of rows (b, P + R): position t predicts response token t.

    Rows that share a prompt (the G samples of a group) run it once: a forward over the distinct prompts
    fills a KV cache (and gives the logits for response token 0), the cache is gathered back to the rows
    and the responses run on top of it. Same values as one forward over the whole rows up to float rounding
    (the matmuls have other shapes); the gradient reaches the shared prompt through the gather. The last
    response token only ever serves as a target, so it is not run. One process only: under DDP every
    forward call syncs buffers, so all ranks must make the same number of calls, whatever their prompts.
    """
    b, width = input_ids.shape
    r_len = width - p_len
    prompts = torch.cat([input_ids[:, :p_len], attention_mask[:, :p_len]], dim=1)  # (b, 2P)
    distinct, inverse = torch.unique(prompts, dim=0, return_inverse=True)
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    if ddp or distinct.shape[0] == b or p_len < 1 or r_len < 2:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            logits_to_keep=r_len + 1,
            use_cache=False,
        )
        return out.logits[:, :-1, :]
    rows = torch.arange(b, device=input_ids.device)
    first = torch.full((distinct.shape[0],), b, device=input_ids.device).scatter_reduce(
        0, inverse, rows, "amin"
    )  # (u,)
    cache = DynamicCache(config=hf_model(model).config)
    cache_kw = cache_argument(model)
    head = model(
        input_ids=input_ids[first, :p_len],
        attention_mask=attention_mask[first, :p_len],
        position_ids=position_ids[first, :p_len],
        logits_to_keep=1,
        use_cache=True,
        **{cache_kw: cache},
    )
    cache.batch_select_indices(inverse)
    tail = model(
        input_ids=input_ids[:, p_len:-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=position_ids[:, p_len:-1],
        logits_to_keep=r_len - 1,
        use_cache=True,
        **{cache_kw: cache},
    )
    return torch.cat([head.logits[inverse], tail.logits], dim=1)


def align_tensors(model: torch.nn.Module, alignment: int = 64) -> None:
    """Moves parameters and buffers that sit off a 64-byte boundary into fresh (aligned) memory.

    Weights read from safetensors can start at any 8-byte offset, and CPU matmul kernels round differently
    for misaligned operands in some shapes (small row counts): a run resumed from a checkpoint would then
    drift by float rounding from the uninterrupted run, whose weights torch allocated itself.
    """
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.data_ptr() % alignment:
                tensor.data = tensor.data.clone()


def forward_is_deterministic(model: torch.nn.Module) -> bool:
    """No dropout in train mode: no dropout module with p > 0 (LoRA's included), no attention dropout."""
    config = getattr(hf_model(model), "config", None)
    if float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0.0:
        return False
    return not any(isinstance(m, torch.nn.Dropout) and m.p > 0.0 for m in model.modules())


SFT_SCHEDULES = ("constant", "cosine")
LR_SCHEDULES = ("constant", "linear", "cosine")
REDUCTIONS = ("sum", "max")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


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


def sft_lr_factor(sft: SftSpec, i: int) -> float:
    """Multiplier of sft.lr at SFT step i (0-based): linear warm-up, then constant or cosine decay that
    reaches sft.min_lr_ratio at the last step."""
    if sft.schedule not in SFT_SCHEDULES:
        raise ValueError(f"sft schedule must be one of {', '.join(SFT_SCHEDULES)}, got {sft.schedule!r}")
    if i < sft.warmup_steps:
        return (i + 1) / sft.warmup_steps
    if sft.schedule == "constant":
        return 1.0
    span = max(1, sft.steps - 1 - sft.warmup_steps)
    progress = min(1.0, (i - sft.warmup_steps) / span)
    return sft.min_lr_ratio + (1.0 - sft.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def sft_loss(logits: Tensor, labels: Tensor, label_smoothing: float) -> Tensor:
    """Token-mean cross-entropy of next-token predictions against (1 − ε)·one-hot(label) + ε/V, over the
    positions whose label is not −100. Position t predicts label t + 1, as in the model's own loss."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        labels[:, 1:].reshape(-1),
        ignore_index=-100,
        label_smoothing=label_smoothing,
    )


def micro_batches(n: int, size: int) -> list[Tensor]:
    return [torch.arange(s, min(s + size, n)) for s in range(0, n, size)]


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


def policy_update(
    model: torch.nn.Module,
    accelerator: Accelerator,
    batch: StepBatch,
    *,
    loss_name: str,
    loss_params: Any,
    control: Any = None,
    temperature: float,
    micro_batch_size: int,
    max_response_length: int,
    num_micro_batches: int | None = None,
    nan_injection: bool = False,
    step: int = 0,
    first_pass: tuple[Tensor, Tensor | None, Tensor | None] | None = None,
    entropy_grad: bool = False,
) -> tuple[dict[str, float], Tensor, Tensor, Tensor]:
    """Forward/backward over micro-batches with step-global normalisers; no optimiser step here.

    Returns (token-weighted metrics, logprob, entropy, correction) of the training pass. Every process runs
    the same number of micro-batches (padded with zero-weight ones) so gradient synchronisation never hangs.
    `control`: the state of the algorithm's controller this step, for the loss (None: its initial state).
    `first_pass`: response_stats of micro-batch 0, already run with grad (the engine's one-pass path).
    `entropy_grad`: the loss has an entropy term, so the training pass's entropy carries its gradient.
    """
    r = batch.rollout
    rows = micro_batches(r.size, micro_batch_size)
    total = num_micro_batches if num_micro_batches is not None else len(rows)
    world = accelerator.num_processes
    sums: dict[str, float] = {}
    weight_total = 0.0
    logprobs = torch.zeros_like(r.response_mask)
    entropies = torch.zeros_like(r.response_mask)
    corrections = torch.zeros_like(r.response_mask)
    for i in range(total):
        padding = i >= len(rows)
        idx = rows[0][:1] if padding else rows[i]
        sync = i == total - 1
        ctx = contextlib.nullcontext() if sync else accelerator.no_sync(model)
        with ctx:
            if i == 0 and first_pass is not None:
                logprob, entropy, correction = first_pass
            else:
                skip_rows = batch.skip_rows[idx] if batch.skip_rows is not None else None
                logprob, entropy, correction = response_stats(
                    model,
                    r,
                    idx,
                    temperature,
                    with_entropy=True,
                    skip_rows=skip_rows,
                    entropy_grad=entropy_grad,
                )
            mask = r.response_mask[idx] * (0.0 if padding else 1.0)
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
            loss, metrics = compute_policy_loss(loss_name, inputs, loss_params, control=control)
            if nan_injection:
                loss = loss * float("nan")
            if not torch.isfinite(loss):
                raise NonFiniteError(step, "loss")
            # DDP averages gradients over processes; the local loss is a share of the global sum. A loss
            # without a graph comes from a micro-batch of skipped rows only (StepBatch.skip_rows).
            if loss.requires_grad:
                accelerator.backward(loss * world)
        if padding:
            continue
        logprobs[idx] = logprob.detach()
        assert entropy is not None and correction is not None
        entropies[idx] = entropy.detach()
        corrections[idx] = correction
        w = float(metrics["tokens/active"])
        weight_total += w
        for key, value in metrics.items():
            if key == "tokens/active":
                continue
            if key == "loss/policy":
                sums[key] = sums.get(key, 0.0) + float(value)  # shares of the step loss add up
            else:
                sums[key] = sums.get(key, 0.0) + float(value) * w
    merged = {k: (v if k == "loss/policy" else v / max(weight_total, 1.0)) for k, v in sums.items()}
    return merged, logprobs, entropies, corrections


# ------------------------------------------------------------------------------------------ optimisations


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
    on-policy STARE (or the adaptive entropy bonus) over more than one micro-batch (`Engine.old_policy`;
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


# ------------------------------------------------------------------------------------------ data


class PromptOrder:
    """The training prompts in a seeded order, a fresh permutation per epoch, read through a cursor (saved
    in checkpoints, so a resumed run takes the prompts the uninterrupted one would have)."""

    def __init__(self, examples: list[Example], seed: int, cursor: int = 0) -> None:
        if not examples:
            raise ValueError("task: no training examples")
        self.examples, self.seed, self.cursor = examples, seed, cursor
        self._order: tuple[int, list[int]] | None = None

    def take(self, n: int) -> tuple[list[Example], int]:
        """The next n prompts; returns them and the first one's global index."""
        start = self.cursor
        size = len(self.examples)
        out = []
        for pos in range(start, start + n):
            epoch, offset = divmod(pos, size)
            out.append(self.examples[self._epoch_order(epoch)[offset]])
        self.cursor += n
        return out, start

    def _epoch_order(self, epoch: int) -> list[int]:
        """The seeded permutation of the examples for `epoch`, drawn once per epoch."""
        if self._order is None or self._order[0] != epoch:
            g = torch.Generator().manual_seed(self.seed * 7_777 + epoch)
            self._order = (epoch, torch.randperm(len(self.examples), generator=g).tolist())
        return self._order[1]


def load_examples(spec: TrainSpec) -> tuple[PromptOrder, list[Example]]:
    """The task's training prompts, in their seeded order, and its evaluation examples."""
    t = spec.task
    train, evaluation = make_train_eval(
        t.source,
        name=t.name,
        path=t.path,
        size=t.train_size,
        eval_size=t.eval_size,
        seed=spec.seed,
        params=t.params,
    )
    return PromptOrder(train, spec.seed), evaluation


# ------------------------------------------------------------------------------------------ the engine


class Engine:
    """One training run: `run()` does it all (setup, SFT warm-start, steps, checkpoints, evaluation, the
    report). Benches and tests that drive the steps themselves call `setup()`, then `train_step()`."""

    prompts: PromptOrder  # set by setup()
    eval_examples: list[Example]

    def __init__(
        self,
        spec: TrainSpec,
        out_dir: str | Path,
        *,
        resume: bool = False,
        callbacks: Sequence[EventCallback] | None = None,
        progress: bool | None = None,
    ) -> None:
        self.spec = spec
        self.out = Path(out_dir)
        self.resume = resume
        self.callbacks = list(callbacks or [])
        self.progress = sys.stderr.isatty() if progress is None else progress
        self._stop_signal: int | None = None
        if not self.progress:
            import transformers

            transformers.utils.logging.disable_progress_bar()
        self.accelerator = Accelerator(
            cpu=not torch.cuda.is_available(), mixed_precision=spec.distributed.mixed_precision
        )
        self.device = self.accelerator.device
        if self.device.type == "cpu":
            heap.keep_freed_heap()  # no page faults for the activations every step reallocates
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        self.is_main = self.accelerator.is_main_process
        # optim.kl_beta is the KL penalty's weight (β·k3 to the reference policy, ALGORITHMS.md); the spec
        # keeps it out of algorithm.params so there is one place to set it.
        kl = {"kl_beta": spec.optim.kl_beta} if spec.optim.kl_beta > 0 else {}
        self.loss_params = make_loss_params(spec.algorithm.name, **spec.algorithm.params, **kl)
        self.algorithm = algorithms.get(spec.algorithm.name)
        self.gate_params = spec.algorithm.gate_params(self.loss_params)
        self.controller: stare.StareControllerState = stare.initial_state(self.gate_params)
        self.entropy_coef: EntropyCoefState | None = (
            initial_coef_state(self.loss_params)
            if isinstance(self.loss_params, AdaptiveEntropyParams)
            else None
        )
        self.step = 0
        self.steps_out_of_band = 0
        self.sft_done = False
        self._events_file: Any = None

    # ------------------------------------------------------------------ events

    def emit(self, event: dict[str, Any], *, best_effort: bool = False) -> None:
        """Appends the event to OUT/events.jsonl and hands it to the callbacks (the worker's stdout). A failed
        write raises StorageError, or with best_effort (the storage error's own event) is skipped, so the
        callbacks still get the event."""
        if not self.is_main:
            return
        event = {"time": _now(), **event}
        if self._events_file is not None:
            try:
                with storage_writes(self.out / EVENTS_FILE):
                    self._events_file.write(json.dumps(event, sort_keys=True) + "\n")
                    self._events_file.flush()
            except StorageError:
                if not best_effort:
                    raise
        for callback in self.callbacks:
            callback(event)

    def _open_events(self, resume_step: int | None) -> None:
        if not self.is_main:
            return
        path = self.out / EVENTS_FILE
        with storage_writes(path):
            self._open_events_file(path, resume_step)

    def _open_events_file(self, path: Path, resume_step: int | None) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and path.exists():
            # Drop what the interrupted run wrote after the checkpoint it resumes from.
            kept = []
            for line in path.read_text().splitlines():
                try:
                    ev = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if ev.get("type") in _STEP_EVENTS and ev.get("step", 0) > resume_step:
                    continue
                if ev.get("type") in _END_EVENTS:
                    continue
                kept.append(line)
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(k + "\n" for k in kept))
            os.replace(tmp, path)
        elif path.exists():
            path.unlink()
        self._events_file = open(path, "a", encoding="utf-8")  # noqa: SIM115

    # ------------------------------------------------------------------ setup

    def setup(self, checkpoint: Path | None = None) -> None:
        """Loads the task's data, the model and tokenizer (the checkpoint's weights when given: a resumed
        run) and the optimiser: what `run` does before the first step."""
        self.prompts, self.eval_examples = load_examples(self.spec)
        self._check_environment()
        self._load_model(checkpoint)

    def _check_environment(self) -> None:
        """A job with the python tool needs the sandbox on this machine: without it every call would be a
        tool error and the run would train on nothing, so it stops before it starts (exit 2, naming why)."""
        env = self.spec.environment
        if env is None or "python" not in env.tools:
            return
        from trainer.envs import sandbox

        problem = sandbox.available()
        if problem is not None:
            raise ValueError(f"environment.tools: the python tool cannot run on this machine: {problem}")

    def _load_model(self, checkpoint: Path | None) -> None:
        spec = self.spec
        if spec.model.dtype not in DTYPES:
            raise ValueError(f"model dtype must be one of {', '.join(DTYPES)}, got {spec.model.dtype!r}")
        dtype = DTYPES[spec.model.dtype]
        source = spec.model.name
        if checkpoint is not None and (checkpoint / "model").is_dir() and spec.model.lora is None:
            source = str(checkpoint / "model")
        model: Any
        model, tokenizer = load_model_and_tokenizer(source, dtype=dtype, seed=spec.seed)
        if spec.model.lora is not None:
            lora = spec.model.lora
            if checkpoint is not None and (checkpoint / "adapter").is_dir():
                from peft import PeftModel

                model = PeftModel.from_pretrained(model, str(checkpoint / "adapter"), is_trainable=True)
            else:
                model = apply_lora(
                    model,
                    r=lora.r,
                    alpha=lora.alpha,
                    dropout=lora.dropout,
                    target_modules=lora.target_modules,
                )
        align_tensors(model)
        self.tokenizer = tokenizer
        self.ref_model = None
        self._ref_adapters_off = False  # π_ref is this model with its LoRA adapters switched off
        params = [p for p in model.parameters() if p.requires_grad]
        o = spec.optim
        # fused: one kernel per parameter instead of ~10 elementwise passes over it (docs/BENCHMARKS.md).
        # Deterministic run to run like the single-tensor loop, so resumed runs stay bit-exact; its rounding
        # differs from that loop's in the last bits.
        self.optimizer = torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, fused=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda)
        self.model, self.optimizer = self.accelerator.prepare(model, self.optimizer)
        # The model without its DDP wrapper, for generation and saving (unwrap_model has a cost per call).
        self._unwrapped_model = self.accelerator.unwrap_model(self.model)
        self._forward_is_deterministic = forward_is_deterministic(self.model)
        # The zero-advantage skip, in one process only (under DDP all ranks must make the same forward calls).
        self.skip_zero_advantage = (
            o.skip_zero_advantage
            and self.world == 1
            and zero_advantage_rows_inert(spec.algorithm.name, self.loss_params)
        )
        self.record_sample_stats = reads_sample_stats(
            spec,
            skip_zero_advantage=self.skip_zero_advantage,
            deterministic=self._forward_is_deterministic,
            world=self.world,
        )

    REFERENCE_FILE = Path("reference") / "model.safetensors"

    def _init_reference(self, resumed: bool) -> None:
        """The KL penalty's reference policy π_ref: the policy as RL starts (after any SFT warm-start), frozen.

        A fresh run writes its weights once to OUT/reference/ (temp file, then rename); a resumed run reads
        them back, so π_ref survives restarts and checkpoint pruning. Only with optim.kl_beta > 0.
        """
        spec = self.spec
        if spec.optim.kl_beta <= 0:
            return
        if spec.model.lora is not None and (spec.sft is None or spec.sft.steps == 0):
            # LoRA starts with B = 0, so the adapters add exactly 0 and π_ref is the base model: the policy
            # with its adapters off. No copy and no file; a resumed run gets the same base from the source.
            self._ref_adapters_off = True
            return
        from safetensors.torch import load_model, save_model

        path = self.out / self.REFERENCE_FILE
        reference = copy.deepcopy(self._unwrapped_model)
        if resumed:
            if not path.is_file():
                raise FileNotFoundError(f"{path}: the KL reference policy of this run is missing")
            load_model(reference, str(path), device=str(self.device))
        elif self.is_main:
            tmp = path.with_suffix(".tmp")
            with storage_writes(tmp):
                path.parent.mkdir(parents=True, exist_ok=True)
                save_model(reference, str(tmp))
                os.replace(tmp, path)
        self.accelerator.wait_for_everyone()
        align_tensors(reference)
        reference.eval()
        reference.requires_grad_(False)
        self.ref_model = reference

    def _reference_logprob(self, batch: Rollout) -> Tensor | None:
        """log π_ref of every response token (B, R), without autograd; None without a KL penalty."""
        if self._ref_adapters_off:
            model, adapters_off = self._unwrapped_model, self._unwrapped_model.disable_adapter()
        elif self.ref_model is not None:
            model, adapters_off = self.ref_model, contextlib.nullcontext()
        else:
            return None
        spec = self.spec
        with torch.no_grad(), adapters_off:
            return torch.cat(
                [
                    response_stats(model, batch, idx, spec.sampling.temperature, with_entropy=False)[0]
                    for idx in micro_batches(batch.size, spec.optim.micro_batch_size)
                ]
            )

    def _lr_lambda(self, step: int) -> float:
        o = self.spec.optim
        return lr_factor(o.schedule, step, warmup_steps=o.warmup_steps, steps=o.steps)

    # ------------------------------------------------------------------ SFT warm-start

    def _sft(self) -> None:
        sft = self.spec.sft
        assert sft is not None
        model = self.model
        tok = self.tokenizer
        opt = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=sft.lr,
            betas=(0.9, sft.adam_beta2),
            weight_decay=sft.weight_decay,
        )
        params = [p for group in opt.param_groups for p in group["params"]]
        gen = torch.Generator().manual_seed(self.spec.seed + 11)
        model.train()
        loss_value = float("nan")
        for i in range(sft.steps):
            examples = self.prompts.examples
            idx = torch.randint(len(examples), (sft.batch_size,), generator=gen).tolist()
            idx = idx[self.rank :: self.world]
            exs = [examples[j] for j in idx]
            prompts = [
                render_prompt(
                    e, self.spec.task.prompt_template, tok, use_chat_template=self.spec.task.use_chat_template
                )
                for e in exs
            ]
            p_enc = tok(prompts, add_special_tokens=not self.spec.task.use_chat_template)["input_ids"]
            if self.spec.environment is not None:
                seqs, targets = self._sft_transcripts(exs, p_enc)
            else:
                a_enc = tok([e.answer for e in exs], add_special_tokens=False)["input_ids"]
                seqs = [p + a + [tok.eos_token_id] for p, a in zip(p_enc, a_enc)]
                targets = [[False] * len(p) + [True] * (len(s) - len(p)) for s, p in zip(seqs, p_enc)]
            width = max(len(s) for s in seqs)
            ids = torch.full((len(seqs), width), tok.pad_token_id)
            attn = torch.zeros((len(seqs), width), dtype=torch.long)
            labels = torch.full((len(seqs), width), -100)
            for row, (s, target) in enumerate(zip(seqs, targets)):
                ids[row, width - len(s) :] = torch.tensor(s)
                attn[row, width - len(s) :] = 1
                labels[row, width - len(s) :] = torch.where(
                    torch.tensor(target), torch.tensor(s), torch.tensor(-100)
                )
            ids, attn, labels = ids.to(self.device), attn.to(self.device), labels.to(self.device)
            position_ids = (attn.cumsum(-1) - 1).clamp_min(0)
            if sft.label_smoothing > 0:
                logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits
                loss = sft_loss(logits, labels, sft.label_smoothing)
            else:
                loss = model(
                    input_ids=ids, attention_mask=attn, position_ids=position_ids, labels=labels
                ).loss
            opt.zero_grad(set_to_none=True)
            self.accelerator.backward(loss)
            if sft.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(params, sft.grad_clip)
            for group in opt.param_groups:
                group["lr"] = sft.lr * sft_lr_factor(sft, i)
            opt.step()
            loss_value = float(loss.detach())
            if (i + 1) % 100 == 0 or i + 1 == sft.steps:
                self.emit({"type": EventType.SFT, "step": i + 1, "total": sft.steps, "loss": loss_value})
        self.sft_done = True

    def _sft_transcripts(
        self, examples: list[Example], prompt_ids: list[list[int]]
    ) -> tuple[list[list[int]], list[list[bool]]]:
        """Tool-use SFT rows: the prompt, then a code-generated episode (trainer.envs.tool_use.transcript),
        each model turn closed by EOS; the targets are the model turns' tokens only (tool results, like in
        RL, are context and never a label)."""
        from trainer.envs.tool_use import transcript

        env = self.spec.environment
        assert env is not None
        tok = self.tokenizer
        seqs, targets = [], []
        for example, prompt in zip(examples, prompt_ids):
            seq, target = list(prompt), [False] * len(prompt)
            for text, is_model in transcript(example, env):
                ids = list(tok(text, add_special_tokens=False)["input_ids"])
                if is_model:
                    ids.append(tok.eos_token_id)
                else:
                    ids = ids[: env.max_result_tokens]
                seq += ids
                target += [is_model] * len(ids)
            seqs.append(seq)
            targets.append(target)
        return seqs, targets

    def _reduce(self, values: float | list[float], reduction: str, dtype: torch.dtype) -> Tensor:
        """Sum or max of host numbers over the processes, as a CPU tensor. The tensor travels on the
        accelerator's device (NCCL reduces CUDA tensors only)."""
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
        reduced = self.accelerator.reduce(torch.tensor(values, dtype=dtype, device=self.device), reduction)
        return reduced.cpu()

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        spec = self.spec
        ev = spec.evaluation
        model = self._unwrapped_model
        model.eval()
        examples = self.eval_examples[self.rank :: self.world]
        k = 1 if ev.greedy else ev.k
        correct_sum, pass_sum, length_sum, n_prompts = 0.0, 0.0, 0.0, 0
        for s in range(0, len(examples), 128):
            chunk = examples[s : s + 128]
            if spec.environment is not None:
                chunk_correct, chunk_pass, chunk_length = self._eval_episodes(chunk, k)
                correct_sum, pass_sum = correct_sum + chunk_correct, pass_sum + chunk_pass
                length_sum, n_prompts = length_sum + chunk_length, n_prompts + len(chunk)
                continue
            prompts = [
                render_prompt(
                    e,
                    spec.task.prompt_template,
                    self.tokenizer,
                    use_chat_template=spec.task.use_chat_template,
                )
                for e in chunk
            ]
            ids, _, resp_mask, _, p_len = generate(
                model,
                self.tokenizer,
                prompts,
                num_samples=k,
                temperature=ev.temperature,
                top_p=ev.top_p,
                max_new_tokens=spec.sampling.max_new_tokens,
                greedy=ev.greedy,
                add_special_tokens=not spec.task.use_chat_template,
            )
            for j, ex in enumerate(chunk):
                scores = []
                for t in range(k):
                    row = j * k + t
                    n = int(resp_mask[row].sum())
                    text = str(self.tokenizer.decode(ids[row, p_len : p_len + n], skip_special_tokens=True))
                    scores.append(score(spec.verifier.name, text, ex, spec.verifier.params))
                    length_sum += float(n)
                correct_sum += sum(scores) / k
                pass_sum += float(max(scores) >= 1.0)
                n_prompts += 1
        totals = self._reduce([correct_sum, pass_sum, length_sum, float(n_prompts)], "sum", torch.float64)
        n_total = max(float(totals[3]), 1.0)
        model.train()
        return {
            "eval/avg@k": float(totals[0]) / n_total,
            "eval/pass@k": float(totals[1]) / n_total,
            "eval/k": float(k),
            "eval/response_length": float(totals[2]) / (n_total * k),
            "eval/num_prompts": float(totals[3]),
        }

    def _eval_episodes(self, chunk: list[Example], k: int) -> tuple[float, float, float]:
        """k tool-use episodes per example, scored on their answers: (sum over the examples of the mean
        score, examples with a sample scoring 1, model tokens of every episode)."""
        spec = self.spec
        ev = spec.evaluation
        episodes = run_episodes(
            self._unwrapped_model,
            self.tokenizer,
            chunk,
            spec,
            num_samples=k,
            temperature=ev.temperature,
            top_p=ev.top_p,
            greedy=ev.greedy,
        )
        model_tokens = sum(len(ids) for row in episodes.pieces for ids, is_model in row if is_model)
        scores = [
            score(spec.verifier.name, text, chunk[row // k], spec.verifier.params)
            for row, text in enumerate(episodes.answers)
        ]
        per_example = [scores[j * k : (j + 1) * k] for j in range(len(chunk))]
        return (
            sum(sum(s) / k for s in per_example),
            sum(float(max(s) >= 1.0) for s in per_example),
            float(model_tokens),
        )

    def _run_eval(self) -> dict[str, float]:
        if not self.eval_examples:
            return {}
        metrics = self.evaluate()
        self.emit({"type": EventType.EVAL, "step": self.step, "metrics": metrics})
        return metrics

    # ------------------------------------------------------------------ one step

    def collect(self) -> tuple[Rollout, int]:
        """Rollout for this step on this process, with dynamic sampling. Returns (rollout, gen batches)."""
        spec = self.spec
        n_prompts = spec.optim.prompts_per_step
        ds = spec.optim.dynamic_sampling
        kept: list[Rollout] = []
        kept_groups = 0
        batches = 0
        model = self._unwrapped_model
        model.eval()
        while True:
            examples, first = self.prompts.take(n_prompts)
            mine = list(range(self.rank, n_prompts, self.world))
            r = rollout(
                model,
                self.tokenizer,
                [examples[i] for i in mine],
                first + self.rank,
                spec,
                sample_stats=self.record_sample_stats,
            )
            r.group_ids = torch.tensor([first + mine[i // spec.sampling.group_size] for i in range(r.size)])
            batches += 1
            if ds.enabled:
                keep = informative_groups(
                    r.rewards,
                    r.group_ids,
                    binary=spec.reward.overlong is None and spec.algorithm.name != "dapo",
                )
                r = r.select(torch.nonzero(keep).flatten())
            kept.append(r)
            kept_groups += int(torch.unique(r.group_ids).numel()) if r.size else 0
            if not ds.enabled:
                break
            total = int(self._reduce(kept_groups, "sum", torch.int64))
            if total >= n_prompts or batches >= ds.max_gen_batches:
                break
        model.train()
        non_empty = [k for k in kept if k.size] or [kept[-1]]
        batch = concat_rollouts(non_empty, self.tokenizer.pad_token_id)
        if ds.enabled:  # at most this process's share of the target number of groups
            share = len(range(self.rank, n_prompts, self.world))
            groups = torch.unique_consecutive(batch.group_ids)[:share]
            batch = batch.select(torch.nonzero(torch.isin(batch.group_ids, groups)).flatten())
        return batch, batches

    def train_step(self) -> dict[str, float]:
        """One optimiser step, these steps in this order:

        1. rollout: `collect` (prompts from the cursor, G samples each, verifier rewards, dynamic sampling);
        2. advantages, the step-global token and sequence counts, the zero-advantage skip's rows;
        3. π_old on the step batch: `old_policy`, its one source;
        4. the controllers read H̄ of π_old: `update_controllers` (STARE's gate, the adaptive entropy
           coefficient), then STARE's step-scope weights ω;
        5. the update: `update_policy` (ppo_epochs × policy_update and an optimiser step);
        6. the step's metrics: `step_metrics`.
        The RNGs are reseeded from (seed, step) first, so a resumed run repeats the uninterrupted one.
        """
        spec = self.spec
        step = self.step + 1
        seed_everything(step_seed(spec.seed, step))
        t0 = time.perf_counter()
        batch, gen_batches = self.collect()
        batch = batch.to(self.device)
        t_gen = time.perf_counter() - t0

        advantages, adv_metrics = compute_advantages(spec.algorithm.estimator, batch.rewards, batch.group_ids)
        counts = self._reduce([batch.response_mask.sum().item(), float(batch.size)], "sum", torch.float64)
        global_tokens, global_sequences = float(counts[0]), float(counts[1])
        n_micro = len(micro_batches(batch.size, spec.optim.micro_batch_size))
        n_micro = int(self._reduce(n_micro, "max", torch.int64))
        skip_rows = zero_advantage_skip(advantages) if self.skip_zero_advantage else None

        t_old = time.perf_counter()
        old = self.old_policy(batch, skip_rows, n_micro)
        self.update_controllers(step, old, batch.response_mask, global_tokens)
        token_weights, metrics = self._step_scope_weights(old, advantages, batch.response_mask)

        step_batch = StepBatch(
            batch,
            advantages,
            old.ratio_logprob,
            self._reference_logprob(batch) if batch.size else None,
            token_weights,
            global_tokens,
            global_sequences,
            skip_rows,
        )
        t1 = t_old if old.first_pass is not None else time.perf_counter()
        _inject_crash(step)
        update_metrics, grad_norm = self.update_policy(step, step_batch, old, n_micro)
        t_update = time.perf_counter() - t1

        metrics.update(update_metrics)
        metrics.update({k: float(v) for k, v in adv_metrics.items()})
        metrics.update(
            self.step_metrics(
                step,
                batch,
                advantages,
                old,
                global_tokens,
                global_sequences,
                timings=(t0, t_gen, t_update),
                gen_batches=gen_batches,
                grad_norm=grad_norm,
            )
        )
        self.step = step
        return metrics

    def old_policy(self, batch: Rollout, skip_rows: Tensor | None, n_micro: int) -> OldPolicy:
        """π_old on the step batch: its one source.

        Measured before the update only where something reads it then: a controller (H̄ for STARE's gate
        and the adaptive entropy coefficient, π_old's surprisal for STARE's step-scope ranking) or the ratio
        of an off-policy update (ppo_epochs > 1). Otherwise the update's first training pass is π_old
        (`OldPolicy.fill`). Where measured, from the first of these that applies (all give the same
        numbers up to float rounding):
        1. the one-pass path: on-policy, one micro-batch on every process, no dropout: π_old is π_θ until
           the optimiser step, so the training forward runs first (with grad) and is π_old; the loss is
           then taken on the same graph. One forward instead of two (more micro-batches would hold all
           their graphs at once);
        2. the sample stats: on-policy, π_old is the sampling policy, whose numbers generation recorded
           (`reads_sample_stats`);
        3. a forward without autograd over the batch, whose log-probs are then the ratio's π_old.
        """
        spec = self.spec
        on_policy = spec.optim.ppo_epochs == 1
        measures_first = self.algorithm.measures_entropy_first
        if not (measures_first or not on_policy):
            return OldPolicy()
        temperature = spec.sampling.temperature
        if measures_first and on_policy and n_micro == 1 and self._forward_is_deterministic:
            first = response_stats(
                self.model,
                batch,
                torch.arange(batch.size),
                temperature,
                with_entropy=True,
                skip_rows=skip_rows,
                entropy_grad=self.entropy_coef is not None,
            )
            entropy = first[1].detach() if first[1] is not None else None
            return OldPolicy(first[0].detach(), entropy, first[2], first_pass=first)
        if not batch.size:
            return OldPolicy()
        if on_policy and batch.has_sample_stats:
            return OldPolicy(batch.sample_logprob, batch.sample_entropy, batch.sample_correction)
        with torch.no_grad():
            parts = [
                response_stats(self.model, batch, idx, temperature, with_entropy=True)
                for idx in micro_batches(batch.size, spec.optim.micro_batch_size)
            ]
        logprob = torch.cat([p[0] for p in parts])
        entropy = torch.cat([p[1] for p in parts if p[1] is not None])
        correction = torch.cat([p[2] for p in parts if p[2] is not None])
        return OldPolicy(logprob, entropy, correction, ratio_logprob=logprob)

    def _mean_entropy(self, step: int, entropy: Tensor | None, mask: Tensor, global_tokens: float) -> float:
        """H̄: the token-mean entropy over the step batch of every process; non-finite is an error."""
        h_sum = float((entropy * mask).sum()) if entropy is not None else 0.0
        h_bar = float(self._reduce(h_sum, "sum", torch.float64)) / max(global_tokens, 1.0)
        if not math.isfinite(h_bar):
            raise NonFiniteError(step, "entropy")
        return h_bar

    def update_controllers(self, step: int, old: OldPolicy, mask: Tensor, global_tokens: float) -> None:
        """STARE's gate and the adaptive entropy coefficient, from H̄ of π_old, once per step before the
        update. Their states are what `loss_control` hands the loss."""
        if not self.algorithm.measures_entropy_first:
            return
        h_bar = self._mean_entropy(step, old.entropy, mask, global_tokens)
        if self.entropy_coef is not None:
            assert isinstance(self.loss_params, AdaptiveEntropyParams)
            self.entropy_coef = update_coef(
                self.entropy_coef, h_bar, self.gate_params.target_entropy, self.loss_params
            )
        if self.spec.algorithm.name == "stare":
            self.controller = stare.update(self.controller, h_bar, self.gate_params)

    def loss_control(self) -> Any:
        """The controller state the loss reads this step: STARE's gate state, the adaptive entropy
        coefficient's, or None for the algorithms without a controller."""
        if self.spec.algorithm.name == "stare":
            return self.controller
        return self.entropy_coef

    def _step_scope_weights(
        self, old: OldPolicy, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor | None, dict[str, float]]:
        """STARE's ω over the whole step batch (scope step_batch), ranked by π_old's surprisal, and its
        metrics; None where ω is chosen per micro-batch in the loss."""
        p = self.loss_params
        if not isinstance(p, stare.StareParams) or p.scope != "step_batch" or old.logprob is None:
            return None, {}
        weights, metrics = stare.scope_weights(old.logprob, advantages, mask, p, self.controller)
        return weights, {k: float(v) for k, v in metrics.items()}

    def update_policy(
        self, step: int, batch: StepBatch, old: OldPolicy, n_micro: int
    ) -> tuple[dict[str, float], float]:
        """ppo_epochs × (forward/backward over the micro-batches, gradient clip, optimiser step), then the
        scheduler's step. Returns the last epoch's loss metrics and gradient norm (NaN without a clip)."""
        spec = self.spec
        nan_step = os.environ.get(NAN_STEP_ENV)
        metrics: dict[str, float] = {}
        grad_norm = float("nan")
        for epoch in range(spec.optim.ppo_epochs):
            metrics, logprob, entropy, correction = policy_update(
                self.model,
                self.accelerator,
                batch,
                loss_name=spec.algorithm.name,
                loss_params=self.loss_params,
                control=self.loss_control(),
                temperature=spec.sampling.temperature,
                micro_batch_size=spec.optim.micro_batch_size,
                max_response_length=spec.sampling.max_new_tokens,
                num_micro_batches=n_micro,
                nan_injection=nan_step is not None and int(nan_step) == step,
                step=step,
                first_pass=old.first_pass if epoch == 0 else None,
                entropy_grad=self.entropy_coef is not None,
            )
            if epoch == 0:
                old.fill(logprob, entropy, correction)
            grad_norm = float("nan")
            if spec.optim.grad_clip is not None:
                grad_norm = float(
                    self.accelerator.clip_grad_norm_(self.model.parameters(), spec.optim.grad_clip)
                )
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return metrics, grad_norm

    def step_metrics(
        self,
        step: int,
        batch: Rollout,
        advantages: Tensor,
        old: OldPolicy,
        global_tokens: float,
        global_sequences: float,
        *,
        timings: tuple[float, float, float],
        gen_batches: int,
        grad_norm: float,
    ) -> dict[str, float]:
        """The step's event metrics beyond the loss's: π_old's quadrant table and entropy band, rewards,
        lengths, the optimiser, timings (timings: the step's start, generation and update seconds), and
        the controllers' states."""
        spec = self.spec
        t0, t_gen, t_update = timings
        mask = batch.response_mask
        assert old.entropy is not None and old.correction is not None and old.logprob is not None
        quad = quadrant_analysis(
            advantages, old.logprob, old.entropy, old.correction, mask, global_token_count=global_tokens
        )
        metrics = {k: float(v) for k, v in quad.items()}
        h_bar = self._mean_entropy(step, old.entropy, mask, global_tokens)
        band = spec.entropy_band
        state = BandState.of(h_bar, band.low, band.high)
        self.steps_out_of_band = 0 if state is BandState.IN_BAND else self.steps_out_of_band + 1
        lengths = batch.response_lengths
        elapsed = time.perf_counter() - t0
        tokens = float(self._reduce(float(batch.attention_mask.sum()), "sum", torch.float32))
        metrics.update(
            {
                "entropy/mean": h_bar,
                "entropy/band_low": band.low,
                "entropy/band_high": band.high,
                "entropy/band_state": float(state.code),
                "entropy/steps_out_of_band": float(self.steps_out_of_band),
                "reward/mean": float(batch.rewards.mean()) if batch.size else 0.0,
                "reward/std": float(batch.rewards.std()) if batch.size > 1 else 0.0,
                "reward/accuracy": float(batch.correct.mean()) if batch.size else 0.0,
                "response/length_mean": float(lengths.mean()) if batch.size else 0.0,
                "response/length_max": float(lengths.max()) if batch.size else 0.0,
                "response/truncated_fraction": float(batch.truncated.float().mean()) if batch.size else 0.0,
                "response/reflection_rate": reflection_rate(batch.texts),
                "actor/grad_norm": grad_norm,
                "actor/lr": float(self.scheduler.get_last_lr()[0]),
                "perf/step_seconds": elapsed,
                "perf/generation_seconds": t_gen,
                "perf/update_seconds": t_update,
                "perf/tokens_per_second": tokens / max(elapsed, 1e-9),
                "perf/gen_batches": float(gen_batches),
                "data/responses": global_sequences,
            }
        )
        if batch.tool_counts is not None:
            metrics.update(self._tool_metrics(batch.tool_counts))
        if spec.algorithm.name == "stare":
            metrics.update(
                {
                    "stare/gate_on": float(self.controller.gate_on),
                    "stare/reweight_w": self.controller.reweight_w,
                    "stare/reweight_m": self.controller.reweight_m,
                    "stare/target_entropy": self.gate_params.target_entropy,
                    "stare/batch_entropy": h_bar,
                }
            )
        if self.entropy_coef is not None:
            metrics.update(
                {
                    "entropy_bonus/coef": self.entropy_coef.applied,
                    "entropy_bonus/active": float(self.entropy_coef.applied > 0),
                    "entropy_bonus/target_entropy": self.gate_params.target_entropy,
                }
            )
        return metrics

    def _tool_metrics(self, counts: Tensor) -> dict[str, float]:
        """The tool/* metrics of a tool-use step, from the episodes' counters summed over the processes."""
        from trainer.envs.tool_use import COUNT_FIELDS, tool_metrics

        column_sums = counts.sum(0).tolist() if counts.numel() else [0.0] * len(COUNT_FIELDS)
        totals = self._reduce([*column_sums, float(counts.shape[0])], "sum", torch.float64).tolist()
        return tool_metrics(dict(zip(COUNT_FIELDS, totals[:-1])), totals[-1])

    # ------------------------------------------------------------------ checkpoints

    def _state(self) -> dict[str, Any]:
        return {
            "cursor": self.prompts.cursor,
            "controller": self.controller.to_dict(),
            "entropy_coef": self.entropy_coef.to_dict() if self.entropy_coef is not None else None,
            "steps_out_of_band": self.steps_out_of_band,
            "sft_done": self.sft_done,
            "algorithm": self.spec.algorithm.name,
            "model": self.spec.model.name,
            "time": _now(),
        }

    def save(self) -> Path | None:
        path = None
        if self.is_main:
            path = checkpoints.save_checkpoint(
                self.out / CHECKPOINTS_DIR,
                self.step,
                model=self.accelerator.unwrap_model(self.model),
                tokenizer=self.tokenizer,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                state=self._state(),
                is_lora=self.spec.model.lora is not None,
                merge_lora=self.spec.model.lora is not None and self.spec.model.lora.merge_on_save,
            )
            self.emit({"type": EventType.CHECKPOINT, "step": self.step, "path": str(path)})
            for step in checkpoints.prune(self.out / CHECKPOINTS_DIR, self.spec.checkpoint.keep_last):
                self.emit({"type": EventType.CHECKPOINT_DELETED, "step": step})
        self.accelerator.wait_for_everyone()
        return path

    def _restore(self, path: Path) -> None:
        state, trainer_state = checkpoints.load_state(path)
        self.optimizer.load_state_dict(trainer_state["optimizer"])
        self.scheduler.load_state_dict(trainer_state["scheduler"])
        checkpoints.set_rng_state(trainer_state["rng"])
        self.step = int(state["step"])
        self.prompts.cursor = int(state["cursor"])
        self.controller = stare.StareControllerState.from_dict(state["controller"])
        if self.entropy_coef is not None and state.get("entropy_coef") is not None:
            self.entropy_coef = EntropyCoefState.from_dict(state["entropy_coef"])
        self.steps_out_of_band = int(state["steps_out_of_band"])
        self.sft_done = bool(state["sft_done"])

    # ------------------------------------------------------------------ run

    def request_stop(self, signum: int) -> None:
        """Stops the run after the step in progress, with a checkpoint (what SIGTERM and SIGINT do)."""
        self._stop_signal = signum

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        def handler(signum: int, _frame: Any) -> None:
            self.request_stop(signum)

        previous = {}
        if hasattr(signal, "SIGTERM"):
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(ValueError):  # not in the main thread
                    previous[sig] = signal.signal(sig, handler)
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    def run(self) -> ExitCode:
        spec = self.spec
        ckpt = checkpoints.latest_checkpoint(self.out / CHECKPOINTS_DIR) if self.resume else None
        seed_everything(spec.seed)
        try:
            self._open_events(int(json.loads((ckpt / "state.json").read_text())["step"]) if ckpt else None)
            self.setup(ckpt)
            if ckpt is not None:
                self._restore(ckpt)
                self.emit({"type": EventType.RESUMED, "step": self.step, "checkpoint": str(ckpt)})
            else:
                self.emit(
                    {"type": EventType.STARTED, "spec": spec.resolved(), "total_steps": spec.optim.steps}
                )
            with self._signals():
                return self._loop(ckpt is not None)
        except NonFiniteError as err:
            self.emit(
                {"type": EventType.ERROR, "step": err.step, "code": ErrorCode.NON_FINITE, "message": str(err)}
            )
            return ExitCode.NON_FINITE
        except Interrupted:
            return ExitCode.INTERRUPTED
        except StorageError as err:
            return self._storage_failed(err)
        except OSError as err:
            # A full or read-only disk under a write nobody wrapped is still the storage, not a crash to retry.
            if err.errno not in UNAMBIGUOUS:
                raise
            return self._storage_failed(StorageError(err.errno, err.filename, err.strerror or str(err)))
        finally:
            if self._events_file is not None:
                with contextlib.suppress(OSError):  # the disk may be why we stop
                    self._events_file.close()
                self._events_file = None
                self._write_report()

    def _storage_failed(self, err: StorageError) -> ExitCode:
        """A write failed: say so on stdout (the events file may be where it failed) and on stderr."""
        self.emit(err.event(self.step), best_effort=True)
        print(f"error: {err}", file=sys.stderr, flush=True)
        return ExitCode.STORAGE

    def _loop(self, resumed: bool) -> ExitCode:
        spec = self.spec
        if not resumed:
            if spec.sft is not None and spec.sft.steps > 0 and not self.sft_done:
                self._sft()
            # π_ref is on disk before the step-0 checkpoint: a run that has a checkpoint has its reference.
            self._init_reference(resumed=False)
            self._run_eval()
            self.save()  # step 0: the starting point (after SFT), so every run has a resumable checkpoint
        else:
            self._init_reference(resumed=True)
        bar = None
        if self.progress and self.is_main:
            from tqdm import tqdm

            bar = tqdm(total=spec.optim.steps, initial=self.step, unit="step", dynamic_ncols=True)
        last_saved = self.step
        while self.step < spec.optim.steps:
            metrics = self.train_step()
            self.emit({"type": EventType.STEP, "step": self.step, "metrics": metrics})
            if os.environ.get(STEP_DELAY_ENV):
                time.sleep(float(os.environ[STEP_DELAY_ENV]))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(H=f"{metrics['entropy/mean']:.3f}", acc=f"{metrics['reward/accuracy']:.2f}")
            if (
                spec.evaluation.interval
                and self.step % spec.evaluation.interval == 0
                and self.step < spec.optim.steps
            ):
                self._run_eval()
            if self.step % spec.checkpoint.interval == 0:
                self.save()
                last_saved = self.step
            if self._stop_signal is not None:
                if last_saved != self.step:
                    self.save()
                self.emit(
                    {"type": EventType.INTERRUPTED, "step": self.step, "signal": int(self._stop_signal)}
                )
                raise Interrupted
        if bar is not None:
            bar.close()
        final = self._run_eval()
        if last_saved != self.step:
            self.save()
        self.emit({"type": EventType.FINISHED, "step": self.step, "status": "succeeded", "final_eval": final})
        return ExitCode.OK

    def _write_report(self) -> None:
        if not self.is_main:
            return
        from trainer.report import load_events

        with contextlib.suppress(Exception):
            write_report(load_events(self.out / EVENTS_FILE), self.out)
