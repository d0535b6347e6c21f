"""The RL engine: a job spec in, a trained checkpoint, per-step events and an evaluation report out.

One optimiser step k (`Engine.train_step`):
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
  6. one event with every metric; checkpoint / evaluation at their intervals.
Each step reseeds the RNGs from (seed, step), each prompt samples from its own stream (trainer.rollout.sampling).

The engine owns the step and the run loop; the rest is one module per concept in trainer/ (its folder map).

Exit codes (contract.protocol.ExitCode, re-exported here): 0 done; 2 invalid spec or data (user error);
3 non-finite loss or entropy (the error names the step; the last checkpoint stays); 74 a write to the run
folder failed (disk full, read-only, I/O error: the `error` event carries code, errno and path; the
checkpoints written before stay, a half-written one is removed); 75 stopped by SIGTERM/SIGINT after writing
a checkpoint (resume with --resume); 1 anything else (a crash: the traceback is on stderr).
"""

from __future__ import annotations

import contextlib
import json
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
from contract.protocol import CHECKPOINTS_DIR, EVENTS_FILE, ErrorCode, EventType, ExitCode
from contract.spec import TrainSpec
from contract.storage import UNAMBIGUOUS, StorageError
from trainer import checkpoints
from trainer.algos import compute_advantages, make_loss_params, quadrant_analysis, zero_advantage_rows_inert
from trainer.algos.control import StepStatistics
from trainer.controllers import Controllers
from trainer.data import PromptOrder, collect, load_examples
from trainer.distributed import Strategy
from trainer.distributed.runtime import Runtime
from trainer.envs import sandbox
from trainer.envs.tool_use import reduced_tool_metrics
from trainer.evaluation import evaluate
from trainer.graders.health import GraderFailed
from trainer.graders.job import JobGrading
from trainer.policy import placement
from trainer.policy.scoring import forward_is_deterministic
from trainer.policy.update import (
    LossSetup,
    NonFiniteError,
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
from trainer.report import load_events, write_report
from trainer.rollout.batch import Rollout, reflection_rate
from trainer.rollout.generation import RolloutEngine
from trainer.rollout.hybrid import Rollouts
from trainer.rollout.mismatch import corrected_advantages, step_mismatch_metrics
from trainer.rollout.sampling import SampleStreams
from trainer.rollout.vllm_engine import build_rollout_engine
from trainer.run import events, faults, heap
from trainer.run.events import EventCallback, EventLog, StopPolicy, _now, stop_policy, stop_signals
from trainer.samples import emit_samples, emit_train_samples
from trainer.sft import run_sft
from trainer.tasks.sources import Example
from trainer.warnings import TrainingWarnings

__all__ = ["Engine", "EventCallback", "ExitCode", "NonFiniteError", "seed_everything", "step_seed"]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7_919) % (2**63 - 1)


class Engine:
    """One training run: `run()` does it all (setup, SFT warm-start, steps, checkpoints, evaluation, the
    report). Benches and tests that drive the steps themselves call `setup()`, then `train_step()`."""

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
        old = measure_old_policy(
            self.model, batch, skip_rows, spec=spec, n_micro=n_micro,
            deterministic=self._forward_is_deterministic, entropy_grad=self.algorithm.differentiable_entropy,
            full_weights=self.strategy.full_weights, share_prompts=share,
        )  # 3  # fmt: skip
        if spec.rollout.tis_cap is not None and old.logprob is None and batch.size:
            # The TIS correction's π_old. Processes hold different numbers of rows (dynamic sampling): full
            # weights, so their different numbers of forwards meet in no collective.
            with self.strategy.full_weights(self.model) as full:
                old = no_grad_pass(full, batch, spec.sampling.temperature, spec.optim.micro_batch_size)
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
        mismatch = step_mismatch_metrics(
            batch, old.logprob, self.runtime.reduce, spec.rollout.tis_cap, old.entropy
        )
        metrics.update(mismatch)
        metrics.update(
            self.step_metrics(
                batch, advantages, old, h_bar, global_tokens, global_sequences,
                timings=(t0, t_gen, t_update), gen_batches=gen_batches, grad_norm=grad_norm,
            )
        )  # 6  # fmt: skip
        self.step = step
        return metrics

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
        """The step's event metrics beyond the loss's: π_old's quadrant table and entropy band, rewards,
        lengths, the optimiser, timings (timings: the step's start, generation and update seconds), and
        the controllers' metrics."""
        t0, t_gen, t_update = timings
        mask = batch.response_mask
        assert old.entropy is not None and old.correction is not None and old.logprob is not None
        quad = quadrant_analysis(
            advantages, old.logprob, old.entropy, old.correction, mask, global_token_count=global_tokens
        )
        metrics = {k: float(v) for k, v in quad.items()}
        band = self.controllers.band
        assert band is not None  # resolved on the first step at the latest
        state = BandState.of(h_bar, band[0], band[1])
        self.steps_out_of_band = 0 if state is BandState.IN_BAND else self.steps_out_of_band + 1
        lengths = batch.response_lengths
        elapsed = time.perf_counter() - t0
        tokens = float(self.runtime.reduce(float(batch.attention_mask.sum()), "sum", torch.float32))
        metrics.update(
            {
                "entropy/mean": h_bar,
                "entropy/band_low": band[0],
                "entropy/band_high": band[1],
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
            metrics.update(reduced_tool_metrics(batch.tool_counts, self.runtime.reduce))
        metrics.update(self.controllers.metrics(StepStatistics(batch_entropy=h_bar)))
        if self.grading is not None:
            metrics.update(self.grading.step_metrics(elapsed))
        return metrics

    # ------------------------------------------------------------------ checkpoints

    def _state(self) -> dict[str, Any]:
        return {
            "cursor": self.prompts.cursor,
            **self.controllers.state_dict(),
            "steps_out_of_band": self.steps_out_of_band,
            "sft_done": self.sft_done,
            "algorithm": self.spec.algorithm.name,
            "model": self.spec.model.name,
            "time": _now(),
        }

    def save(self) -> Path | None:
        path = placement.save_training_state(
            self.out,
            self.step,
            runtime=self.runtime,
            model=self.model,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            state=self._state(),
            spec=self.spec,
        )  # fmt: skip  (collective: under fsdp2 every process writes its shards)
        if self.is_main:
            self.emit({"type": EventType.CHECKPOINT, "step": self.step, "path": str(path)})
            for step in checkpoints.prune(self.out / CHECKPOINTS_DIR, self.spec.checkpoint.keep_last):
                self.emit({"type": EventType.CHECKPOINT_DELETED, "step": step})
        self.runtime.barrier()
        return path

    def _restore(self, path: Path) -> None:
        state = placement.restore_training_state(
            path, self.model, self.optimizer, self.scheduler, runtime=self.runtime
        )
        self.rollouts.policy_changed()
        self.step = int(state["step"])
        self.prompts.cursor = int(state["cursor"])
        self.controllers.load_state_dict(state)
        self.steps_out_of_band = int(state["steps_out_of_band"])
        self.sft_done = bool(state["sft_done"])

    # ------------------------------------------------------------------ run
    def request_stop(self, signum: int) -> None:
        """SIGTERM, SIGINT: stop after the step in progress, with a checkpoint; while loading, at once."""
        self.stop.request(signum)
        self.stop.interrupt_while_loading()

    def run(self) -> ExitCode:
        spec = self.spec
        ckpt = checkpoints.latest_checkpoint(self.out / CHECKPOINTS_DIR) if self.resume else None
        seed_everything(spec.seed)
        try:
            with stop_signals(self.request_stop):  # from the start: a stop while the model loads acts at once
                self.events.open(int(json.loads((ckpt / "state.json").read_text())["step"]) if ckpt else None)
                self.setup(ckpt)
                if ckpt is not None:
                    self._restore(ckpt)
                    self.emit({"type": EventType.RESUMED, "step": self.step, "checkpoint": str(ckpt)})
                else:
                    total = spec.optim.steps
                    self.emit({"type": EventType.STARTED, "spec": spec.resolved(), "total_steps": total})
                return self._loop(ckpt is not None)
        except NonFiniteError as err:
            self.emit(
                {"type": EventType.ERROR, "step": err.step, "code": ErrorCode.NON_FINITE, "message": str(err)}
            )
            return ExitCode.NON_FINITE
        except GraderFailed as err:  # a user error naming the first failure (trainer.graders.health)
            self.emit(err.event(self.step + 1))
            return ExitCode.GRADER_FAILED
        except events.Interrupted:
            return ExitCode.INTERRUPTED
        except StorageError as err:
            return self._storage_failed(err)
        except OSError as err:
            # A full or read-only disk under a write nobody wrapped is still the storage, not a crash to retry.
            if err.errno not in UNAMBIGUOUS:
                raise
            return self._storage_failed(StorageError(err.errno, err.filename, err.strerror or str(err)))
        finally:
            if self.grading is not None:
                self.grading.close()
            if self.events.is_open:
                self.events.close()
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
            self.init_reference(resumed=False)
            self._run_eval()
            self.stop.loading = False  # from here a stop request waits for a step's end (and its checkpoint)
            self.save()  # step 0: the starting point (after SFT), so every run has a resumable checkpoint
        else:
            self.init_reference(resumed=True)
            self.stop.loading = False
        bar = None
        if self.progress and self.is_main:
            from tqdm import tqdm

            bar = tqdm(total=spec.optim.steps, initial=self.step, unit="step", dynamic_ncols=True)
        last_saved = self.step
        while self.step < spec.optim.steps:
            metrics = self.train_step()
            self.emit({"type": EventType.STEP, "step": self.step, "metrics": metrics})
            self.warnings.after_step(self.step, metrics)
            emit_train_samples(self.emit, self.step, self.last_rollout, self.prompts.example_at)
            faults.after_step()
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
            signum = self.stop.agreed(self.runtime.reduce)  # every process, once a step, at this point
            if signum is not None:
                if last_saved != self.step:
                    self.save()
                self.emit({"type": EventType.INTERRUPTED, "step": self.step, "signal": signum})
                raise events.Interrupted
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
        with contextlib.suppress(Exception):
            write_report(load_events(self.out / EVENTS_FILE), self.out)
