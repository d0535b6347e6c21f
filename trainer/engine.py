"""The RL engine: a job spec in, a trained checkpoint, per-step events and an evaluation report out.

`Engine.run()` is the run: setup, the SFT warm-start, the step-0 checkpoint and evaluation, then the steps
(trainer.step: what one optimiser step does, in order), checkpoints and evaluations at their intervals, the
final evaluation and the report. The rest is one module per concept in trainer/ (its folder map).

Exit codes (contract.protocol.ExitCode, re-exported here): 0 done; 2 invalid spec or data (user error);
3 non-finite loss or entropy (the error names the step; the last checkpoint stays); 74 a write to the run
folder failed (disk full, read-only, I/O error: the `error` event carries code, errno and path; the
checkpoints written before stay, a half-written one is removed); 75 stopped by SIGTERM/SIGINT after writing
a checkpoint (resume with --resume); 1 anything else (a crash: the traceback is on stderr).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from contract.protocol import CHECKPOINTS_DIR, EVENTS_FILE, ErrorCode, EventType, ExitCode
from contract.storage import UNAMBIGUOUS, StorageError
from trainer import checkpoints
from trainer.graders.health import GraderFailed
from trainer.policy import placement
from trainer.policy.update import NonFiniteError
from trainer.report import load_events, write_report
from trainer.run import events, faults
from trainer.run.events import EventCallback, _now, stop_signals
from trainer.samples import emit_train_samples
from trainer.step import StepEngine, seed_everything, step_seed

__all__ = ["Engine", "EventCallback", "ExitCode", "NonFiniteError", "seed_everything", "step_seed"]


class Engine(StepEngine):
    """One training run: `run()` does it all (setup, SFT warm-start, steps, checkpoints, evaluation, the
    report). Benches and tests that drive the steps themselves call `setup()`, then `train_step()`."""

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
