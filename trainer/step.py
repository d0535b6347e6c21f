"""One optimiser step of the RL engine (`StepEngine.train_step`), and the setup it needs; the run around the
steps (the loop, checkpoints, the report, exit codes) is trainer/engine.py's `Engine`, which extends it.

One optimiser step k:
  1. rollout: prompts from the data cursor, G samples each, verifier rewards (+ DAPO overlong shaping);
     with dynamic sampling, regenerate (≤ max_gen_batches) until the batch holds enough informative groups;
  2. advantages (registry), global token/sequence counts (all-reduced across processes), the rows of the
     zero-advantage skip (`zero_advantage_skip`);
  3. π_old on the step batch (trainer.policy.update.measure_old_policy: one documented path and optimisations
     with the same numbers): measured before the update where a controller or an off-policy ratio reads
     it, else the training pass's own numbers;
  4. the controllers' update from H̄ (token-mean entropy of π_old), once, before the update (a relative
     target resolves on the first step); their state is passed to the loss (trainer.controllers);
  5. ppo_epochs × (micro-batched forward/backward with the step-global normalisers, one optimiser step);
  6. one event with every metric (trainer.run.metrics, the controllers', the grader's).
Each step reseeds the RNGs from (seed, step), each prompt samples from its own stream (trainer.rollout.sampling).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from contract import algorithms
from contract.metrics import BandState
from contract.protocol import EventType
from contract.spec import TrainSpec
from trainer.algos import compute_advantages, make_loss_params, zero_advantage_rows_inert
from trainer.algos.control import StepStatistics
from trainer.controllers import Controllers
from trainer.data import PromptOrder, collect, load_examples
from trainer.distributed import Strategy
from trainer.distributed.runtime import Runtime
from trainer.envs import sandbox
from trainer.evaluation import evaluate
from trainer.graders.job import JobGrading
from trainer.policy import placement
from trainer.policy.scoring import forward_is_deterministic
from trainer.policy.update import (
    LossSetup,
    OldPolicy,
    StepBatch,
    check_finite_entropy,
    lr_factor,
    measure_old_policy,
    micro_batch_plan,
    no_grad_pass,
    policy_update,
    reads_sample_stats,
    zero_advantage_skip,
)
from trainer.rollout.batch import Rollout
from trainer.rollout.generation import RolloutEngine
from trainer.rollout.hybrid import Rollouts
from trainer.rollout.mismatch import corrected_advantages, step_mismatch_metrics
from trainer.rollout.sampling import SampleStreams
from trainer.rollout.vllm_engine import build_rollout_engine
from trainer.run import faults, heap
from trainer.run import metrics as run_metrics
from trainer.run.events import EventCallback, EventLog, StopPolicy, stop_policy
from trainer.run.metrics import StepCounts
from trainer.samples import emit_samples
from trainer.sft import run_sft
from trainer.tasks.sources import Example
from trainer.warnings import TrainingWarnings

__all__ = ["StepEngine", "seed_everything", "step_seed"]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7_919) % (2**63 - 1)


class StepEngine:
    """The engine's steps: `setup()`, then `train_step()` as often as wanted (benches and tests drive it so);
    trainer.engine.Engine runs them (`run()`)."""

    prompts: PromptOrder  # set by setup()
    eval_examples: list[Example]
    grading: JobGrading | None = None  # a job with a grader: its pool, started by setup()

    def __init__(
        self,
        spec: TrainSpec,
        out_dir: str | Path,
        *,
        resume: bool = False,
        callbacks: Sequence[EventCallback] | None = None,
        progress: bool | None = None,
        stop: StopPolicy | None = None,
    ) -> None:
        self.spec = spec
        self.out = Path(out_dir)
        self.resume = resume
        self.progress = sys.stderr.isatty() if progress is None else progress
        if not self.progress:
            import transformers

            transformers.utils.logging.disable_progress_bar()
        # The process group (trainer.distributed.runtime): joins the launcher's (torchrun, Ray Train) or
        # makes a one-member one; refuses a launch whose world size is not the spec's.
        self.runtime = Runtime(spec.distributed)
        self.device = self.runtime.device
        if self.device.type == "cpu":
            heap.keep_freed_heap()  # no page faults for the activations every step reallocates
        self.rank, self.world = self.runtime.rank, self.runtime.world_size
        self.is_main = self.runtime.is_main
        # When to stop early (SIGTERM/SIGINT, or a launcher's request): agreed over the processes above one.
        self.stop = stop if stop is not None else stop_policy(self.world)
        self.events = EventLog(self.out, callbacks or [], is_main=self.is_main)
        # optim.kl_beta is the KL penalty's weight (β·k3 to the reference policy, ALGORITHMS.md); the spec
        # keeps it out of algorithm.params so there is one place to set it.
        kl = {"kl_beta": spec.optim.kl_beta} if spec.optim.kl_beta > 0 else {}
        self.loss_params = make_loss_params(spec.algorithm.name, **spec.algorithm.params, **kl)
        self.algorithm = algorithms.get(spec.algorithm.name)
        self.controllers = Controllers(spec, self.loss_params)
        self.reference: placement.ReferencePolicy | None = None
        self.step = 0
        self.steps_out_of_band = 0
        self.sft_done = False
        self.warnings = TrainingWarnings(spec, self.emit)  # and samples: trainer.warnings, trainer.samples

    @property
    def strategy(self) -> Strategy:
        """How the policy is laid out over the processes (trainer.distributed.strategy)."""
        return self.runtime.strategy

    @property
    def policy(self) -> Any:
        """The policy's module under any training wrapper (DDP's); under fsdp2 the sharded model itself."""
        return self.strategy.policy(self.model)

    @property
    def rollout_engine(self) -> RolloutEngine:
        return self.rollouts.engine

    @property
    def callbacks(self) -> list[EventCallback]:
        return self.events.callbacks

    def emit(self, event: dict[str, Any], *, best_effort: bool = False) -> None:
        self.events.emit(event, best_effort=best_effort)

    # ------------------------------------------------------------------ setup

    def setup(self, checkpoint: Path | None = None) -> None:
        """Loads the task's data, the model and tokenizer (the checkpoint's weights when given: a resumed
        run) and the optimiser: what `run` does before the first step."""
        self.prompts, self.eval_examples = load_examples(self.spec)
        sandbox.check_python_tool(self.spec.environment)
        self.grading = JobGrading.start(self.spec)
        faults.before_load()
        self._load_model(checkpoint)

    def _load_model(self, checkpoint: Path | None) -> None:
        spec = self.spec
        # Under fsdp2 above one process a fresh run's model is a meta-device skeleton whose shards each process
        # reads from the weights' files, or fills from rank 0's loaded model (placement.start_fill).
        fill = placement.start_fill(self.runtime, spec, checkpoint)
        model, self.tokenizer = placement.load_policy(spec, checkpoint, skeleton=fill.skeleton(self.rank))
        self.model, self.optimizer = placement.prepare_for_training(self.runtime, model, spec, fill=fill)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_lambda)
        self._forward_is_deterministic = forward_is_deterministic(self.model)
        # rollout.engine: HF generate on the policy, or a colocated vLLM copy (trainer.rollout.vllm_engine), switched
        # to and from by trainer.rollout.hybrid's rollout_mode
        self.rollouts = Rollouts(
            self.strategy, self.model, build_rollout_engine(spec, self.policy, self.tokenizer)
        )
        # The zero-advantage skip, in one process only (under DDP all ranks must make the same forward calls).
        self.skip_zero_advantage = (
            spec.optim.skip_zero_advantage
            and self.world == 1
            and zero_advantage_rows_inert(spec.algorithm.name, self.loss_params)
        )
        self.record_sample_stats = self.rollouts.engine.gives_pi_old and reads_sample_stats(
            spec,
            skip_zero_advantage=self.skip_zero_advantage,
            deterministic=self._forward_is_deterministic,
            world=self.world,
        )

    def init_reference(self, resumed: bool) -> None:
        """π_ref (placement.ReferencePolicy), only with optim.kl_beta > 0."""
        if self.spec.optim.kl_beta > 0:
            self.reference = placement.ReferencePolicy(
                self.policy, self.spec, self.out, self.runtime, resumed=resumed
            )

    def _lr_lambda(self, step: int) -> float:
        o = self.spec.optim
        return lr_factor(o.schedule, step, warmup_steps=o.warmup_steps, steps=o.steps)

    def _sft(self) -> None:
        run_sft(self.model, self.tokenizer, self.runtime, self.spec, self.prompts.examples, self.emit)
        self.rollouts.policy_changed()
        self.sft_done = True

    def evaluate(self) -> dict[str, float]:
        self.eval_samples: list[dict[str, Any]] = []  # the first examples' completions (trainer.samples)
        share = range(self.rank, len(self.eval_examples), self.world)  # seeds by global index: any world size
        seeds = SampleStreams(self.spec.seed, "eval", self.step).prompt_seeds(share)
        examples = [self.eval_examples[i] for i in share]
        with self.rollouts.rollout_mode() as (model, eng):  # shares differ by a prompt: no collectives
            return evaluate(
                model, self.tokenizer, self.spec, examples, self.runtime.reduce, engine=eng, seeds=seeds,
                grading=self.grading, samples=self.eval_samples,
            )  # fmt: skip

    def _run_eval(self) -> dict[str, float]:
        if not self.eval_examples:
            return {}
        metrics = self.evaluate()
        self.emit({"type": EventType.EVAL, "step": self.step, "metrics": metrics})
        emit_samples(self.emit, self.step, "eval", self.eval_samples)
        return metrics

    # ------------------------------------------------------------------ one step

    last_rollout: Rollout | None = None  # the latest step's (trainer.samples keeps a few of its responses)

    def collect(self, step: int | None = None) -> tuple[Rollout, int]:
        """Rollout for step `step` (default: the next one) on this process, with dynamic sampling; the
        step names the prompts' sampling streams (trainer.rollout.sampling). Returns (rollout, gen batches)."""
        with self.rollouts.rollout_mode() as (model, engine):
            self.last_rollout, batches = collect(
                model, self.tokenizer, self.prompts, self.spec, rank=self.rank, world=self.world,
                sample_stats=self.record_sample_stats, reduce=self.runtime.reduce, engine=engine,
                step=self.step + 1 if step is None else step, grading=self.grading,
            )  # fmt: skip
        return self.last_rollout, batches

    def train_step(self) -> dict[str, float]:
        """One optimiser step, these steps in this order:

        1. rollout: `collect` (prompts from the cursor, G samples each, verifier rewards, dynamic sampling);
        2. advantages, the step-global token and sequence counts, the zero-advantage skip's rows;
        3. π_old on the step batch: `update.measure_old_policy`;
        4. the controllers read H̄ of π_old: `update_controllers`, then their step-scope token weights;
        5. the update: `update_policy` (ppo_epochs × policy_update and an optimiser step);
        6. the step's metrics: `step_metrics`.
        The RNGs are reseeded from (seed, step) first, so a resumed run repeats the uninterrupted one.
        """
        spec = self.spec
        step = self.step + 1
        seed_everything(step_seed(spec.seed, step))
        t0 = time.perf_counter()
        batch, gen_batches = self.collect()  # 1
        batch = batch.to(self.device)
        t_gen = time.perf_counter() - t0

        advantages, adv_metrics = compute_advantages(spec.algorithm.estimator, batch.rewards, batch.group_ids)
        counts = self.runtime.reduce(
            [batch.response_mask.sum().item(), float(batch.size)], "sum", torch.float64
        )
        global_tokens, global_sequences = float(counts[0]), float(counts[1])  # 2
        n_micro, share = micro_batch_plan(
            batch, spec.optim.micro_batch_size, self.runtime.reduce, sharing=self.strategy.prompt_sharing
        )
        skip_rows = zero_advantage_skip(advantages) if self.skip_zero_advantage else None

        t_old = time.perf_counter()
        old = self._old_policy(batch, skip_rows, n_micro, share)  # 3
        h_bar = None
        if self.algorithm.measures_entropy_first:  # 4
            h_bar = self._mean_entropy(step, old.entropy, batch.response_mask, global_tokens)
            self.update_controllers(step, h_bar)
        token_weights, metrics = self.controllers.token_weights(old.logprob, advantages, batch.response_mask)
        reference = self.reference.logprob(batch) if self.reference is not None and batch.size else None
        step_batch = StepBatch(
            batch, corrected_advantages(advantages, batch.sampler_logprob, old.logprob, spec.rollout.tis_cap),
            old.ratio_logprob, reference, token_weights, global_tokens, global_sequences, skip_rows, share,
        )  # fmt: skip
        t1 = t_old if old.first_pass is not None else time.perf_counter()
        faults.crash_at(step)
        update_metrics, grad_norm = self.update_policy(step, step_batch, old, n_micro)  # 5
        t_update = time.perf_counter() - t1

        if h_bar is None:  # π_old is the training pass's (OldPolicy.fill)
            h_bar = self._mean_entropy(step, old.entropy, batch.response_mask, global_tokens)
        metrics.update({**update_metrics, **{k: float(v) for k, v in adv_metrics.items()}})
        metrics.update(
            step_mismatch_metrics(batch, old.logprob, self.runtime.reduce, spec.rollout.tis_cap, old.entropy)
        )
        metrics.update(
            self.step_metrics(
                batch, advantages, old, h_bar, global_tokens, global_sequences,
                timings=(t0, t_gen, t_update), gen_batches=gen_batches, grad_norm=grad_norm,
            )
        )  # 6  # fmt: skip
        self.step = step
        return metrics

    def _old_policy(
        self, batch: Rollout, skip_rows: Tensor | None, n_micro: int, share: bool | None
    ) -> OldPolicy:
        """π_old on the step batch (update.measure_old_policy), and the TIS correction's where that left it
        to the training pass."""
        spec = self.spec
        old = measure_old_policy(
            self.model, batch, skip_rows, spec=spec, n_micro=n_micro,
            deterministic=self._forward_is_deterministic, entropy_grad=self.algorithm.differentiable_entropy,
            full_weights=self.strategy.full_weights, share_prompts=share,
        )  # fmt: skip
        if spec.rollout.tis_cap is not None and old.logprob is None and batch.size:
            # The TIS correction's π_old. Processes hold different numbers of rows (dynamic sampling): full
            # weights, so their different numbers of forwards meet in no collective.
            with self.strategy.full_weights(self.model) as full:
                old = no_grad_pass(full, batch, spec.sampling.temperature, spec.optim.micro_batch_size)
        return old

    def _mean_entropy(self, step: int, entropy: Tensor | None, mask: Tensor, global_tokens: float) -> float:
        """H̄: the token-mean entropy over the step batch of every process; non-finite is an error."""
        h_sum = float((entropy * mask).sum()) if entropy is not None else 0.0
        h_bar = float(self.runtime.reduce(h_sum, "sum", torch.float64)) / max(global_tokens, 1.0)
        return check_finite_entropy(step, h_bar)

    def update_controllers(self, step: int, h_bar: float) -> None:
        """The controllers' update from H̄ of π_old, once per step before the update; on the first step of
        a relative target, the target resolves first (a `targets_resolved` event)."""
        resolved = self.controllers.resolve(h_bar)
        if resolved is not None:
            self.emit({"type": EventType.TARGETS_RESOLVED, "step": step, **resolved})
        self.controllers.update(StepStatistics(batch_entropy=h_bar))

    def loss_control(self) -> Any:
        """The controller state the loss reads this step (None for the algorithms without a controller)."""
        return self.controllers.control()

    def update_policy(
        self, step: int, batch: StepBatch, old: OldPolicy, n_micro: int
    ) -> tuple[dict[str, float], float]:
        """ppo_epochs × (forward/backward over the micro-batches, gradient clip, optimiser step), then the
        scheduler's step. Returns the last epoch's loss metrics and gradient norm (NaN without a clip)."""
        spec = self.spec
        loss = LossSetup(
            spec.algorithm.name,
            self.loss_params,
            self.loss_control(),
            entropy_grad=self.algorithm.differentiable_entropy,
            controller_metrics=self.controllers.owned_metrics(),
        )
        metrics: dict[str, float] = {}
        grad_norm = float("nan")
        for epoch in range(spec.optim.ppo_epochs):
            metrics, logprob, entropy, correction = policy_update(
                self.model,
                self.runtime,
                batch,
                loss,
                temperature=spec.sampling.temperature,
                micro_batch_size=spec.optim.micro_batch_size,
                max_response_length=spec.sampling.max_new_tokens,
                num_micro_batches=n_micro,
                nan_injection=faults.nan_loss_at(step),
                step=step,
                first_pass=old.first_pass if epoch == 0 else None,
            )
            if epoch == 0:
                old.fill(logprob, entropy, correction)
            grad_norm = float("nan")
            if spec.optim.grad_clip is not None:
                grad_norm = float(self.runtime.clip_grad_norm_(self.model.parameters(), spec.optim.grad_clip))
            self.optimizer.step()
            self.rollouts.policy_changed()
            metrics.update(placement.held_bytes(self.model, self.optimizer, self.runtime.reduce))
            self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return metrics, grad_norm

    def step_metrics(
        self,
        batch: Rollout,
        advantages: Tensor,
        old: OldPolicy,
        h_bar: float,
        global_tokens: float,
        global_sequences: float,
        *,
        timings: tuple[float, float, float],
        gen_batches: int,
        grad_norm: float,
    ) -> dict[str, float]:
        """The step's event metrics beyond the loss's (trainer.run.metrics: π_old's quadrant table and entropy
        band, rewards, lengths, the optimiser, timings), then the controllers' and the grader's."""
        band = self.controllers.band
        assert band is not None  # resolved on the first step at the latest
        state = BandState.of(h_bar, band[0], band[1])
        self.steps_out_of_band = 0 if state is BandState.IN_BAND else self.steps_out_of_band + 1
        counts = StepCounts(global_tokens, global_sequences, gen_batches, self.steps_out_of_band)
        assert old.entropy is not None and old.correction is not None and old.logprob is not None
        metrics = run_metrics.step_metrics(
            batch, advantages, (old.logprob, old.entropy, old.correction), h_bar, band, counts, self.runtime.reduce,
            timings=timings, grad_norm=grad_norm, lr=float(self.scheduler.get_last_lr()[0]),
        )  # fmt: skip
        metrics.update(self.controllers.metrics(StepStatistics(batch_entropy=h_bar)))
        if self.grading is not None:
            metrics.update(self.grading.step_metrics(time.perf_counter() - timings[0]))
        return metrics
