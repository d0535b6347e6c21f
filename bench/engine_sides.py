"""The processes of bench_engine.py: each side of a comparison (ours: the engine; TRL: GRPOTrainer) runs in
its own spawned process (`worker`) and takes one optimiser step per "step" command from the parent, which
holds it as a `Side`."""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import tempfile
import time
import warnings
from multiprocessing.connection import Connection
from typing import Any

from engine_cases import Case, engine_prompt_order, train_spec


class OurSide:
    def __init__(self, case: Case, algorithm: str, scratch: str, skip_zero_advantage: bool = True) -> None:
        from trainer.engine import Engine, seed_everything

        spec = train_spec(case, algorithm, skip_zero_advantage)
        self.engine = Engine(spec, scratch, progress=False)
        seed_everything(spec.seed)
        self.engine.setup()
        model = self.engine.policy
        model.generation_config.min_new_tokens = case.new_tokens  # equal lengths, see the docstring
        model.train()

    def step(self) -> dict[str, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        m = self.engine.train_step()
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        tokens = round(m["perf/tokens_per_second"] * m["perf/step_seconds"])
        response = round(m["response/length_mean"] * m["data/responses"])
        out = {
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,
            "tokens": tokens,
            "response_tokens": response,
            "generation_seconds": m["perf/generation_seconds"],
            "update_seconds": m["perf/update_seconds"],
            "zero_std_fraction": m["reward/zero_std_fraction"],
        }
        if "stare/gate_on" in m:
            out["gate_on"] = m["stare/gate_on"]
        return out


def trl_reward_function(verifier: str, params: dict[str, Any], chat: bool) -> Any:
    from trainer.tasks.sources import Example
    from trainer.tasks.verifiers import score, shape_reward

    def reward(prompts: list[Any], completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[0]["content"] if chat else c for c in completions]
        return [
            shape_reward(score(verifier, t, Example(prompt="", answer=a), params), "binary")
            for t, a in zip(texts, answer)
        ]

    reward.__name__ = f"verifier_{verifier}"
    return reward


def trl_config(case: Case, scratch: str, total: int) -> Any:
    """GRPOConfig set up as the module docstring of bench_engine.py lists (TRL's side of the comparison)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=scratch,
        seed=case.seed,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=case.responses,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=case.samples,
        max_completion_length=case.new_tokens,
        generation_kwargs={"min_new_tokens": case.new_tokens},
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        loss_type="grpo",
        beta=0.0,
        epsilon=0.2,
        num_iterations=1,
        scale_rewards="group",
        entropy_coef=0.0,
        learning_rate=case.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        optim="adamw_torch",
        max_grad_norm=1.0,
        max_steps=total,
        shuffle_dataset=False,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )


def trl_handoff(conn: Connection, case: Case, total: int) -> Any:
    """The TrainerCallback that hands control to the parent: it waits for a "step" command before the
    first step and after each one but the last, and sends each step's times and token counts."""
    import transformers

    class Handoff(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.t_go = 0.0
            self.c_go = 0.0
            self.tokens_seen = 0
            self.generation_seconds = 0.0

        def wait(self) -> None:
            message = conn.recv()
            assert message == "step", message
            self.t_go, self.c_go = time.perf_counter(), time.process_time()

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.wait()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            seconds, cpu_seconds = time.perf_counter() - self.t_go, time.process_time() - self.c_go
            tokens = int(state.num_input_tokens_seen) - self.tokens_seen
            self.tokens_seen = int(state.num_input_tokens_seen)
            conn.send(
                {
                    "seconds": seconds,
                    "cpu_seconds": cpu_seconds,
                    "tokens": tokens,
                    "response_tokens": case.responses * case.new_tokens,
                    "generation_seconds": self.generation_seconds,
                    "update_seconds": seconds - self.generation_seconds,
                }
            )
            self.generation_seconds = 0.0
            if state.global_step < total:
                self.wait()

    return Handoff()


def run_trl(case: Case, conn: Connection, scratch: str) -> None:
    """Drives GRPOTrainer.train(); a callback hands control to the parent after every optimiser step."""
    import datasets
    import torch
    import transformers
    from trl import GRPOTrainer

    from trainer.models import load_model_and_tokenizer
    from trainer.tasks.sources import render_prompt

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    warnings.filterwarnings("ignore", category=FutureWarning)  # TRL sets deprecated TrainingArguments
    spec = train_spec(case, "grpo")
    total = case.warmup + case.steps
    examples = engine_prompt_order(spec, total)
    torch.manual_seed(case.seed)
    model, tokenizer = load_model_and_tokenizer(case.model, dtype=torch.float32, seed=case.seed)
    rows = [
        {
            "prompt": [{"role": "user", "content": e.prompt}] if case.chat else render_prompt(e),
            "answer": e.answer,
        }
        for e in examples
    ]
    config = trl_config(case, scratch, total)
    handoff = trl_handoff(conn, case, total)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=trl_reward_function(case.verifier, dict(case.verifier_params), case.chat),
        args=config,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[handoff],
    )
    trainer.remove_callback(transformers.PrinterCallback)  # the end-of-training summary line
    generate_and_score = trainer._generate_and_score_completions

    def timed_generate_and_score(*a: Any, **kw: Any) -> Any:  # generation + rewards + advantages
        t0 = time.perf_counter()
        try:
            return generate_and_score(*a, **kw)
        finally:
            handoff.generation_seconds += time.perf_counter() - t0

    trainer._generate_and_score_completions = timed_generate_and_score  # type: ignore[method-assign]
    conn.send({"ready": True, "threads": torch.get_num_threads()})
    trainer.train()


def worker(
    side: str, case: Case, algorithm: str, threads: int, options: dict[str, bool], conn: Connection
) -> None:
    # Before anything allocates: the heap setting is per process (trainer/run/heap.py reads the variable when
    # the engine starts; the TRL side applies it here).
    os.environ["STARE_HEAP_TUNING"] = "1" if options.get("heap", False) else "0"
    import torch

    from trainer.run import heap

    if options.get("heap", False):
        assert heap.keep_freed_heap(), "the heap setting did not apply"
    torch.set_num_threads(threads)
    scratch = tempfile.TemporaryDirectory(prefix=f"bench-engine-{side}-")
    try:
        if side == "trl":
            run_trl(case, conn, scratch.name)
        else:
            ours = OurSide(case, algorithm, scratch.name, skip_zero_advantage=options.get("skip", True))
            conn.send({"ready": True, "threads": torch.get_num_threads()})
            for _ in range(case.warmup + case.steps):
                message = conn.recv()
                assert message == "step", message
                conn.send(ours.step())
        assert conn.recv() == "stop"
        conn.send({"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})
    except BaseException as err:
        conn.send({"error": f"{type(err).__name__}: {err}"})
        raise
    finally:
        scratch.cleanup()


# ------------------------------------------------------------------------------------------ the parent


class Side:
    def __init__(
        self, name: str, side: str, case: Case, algorithm: str, threads: int, options: dict[str, bool]
    ) -> None:
        self.name = name
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=worker, args=(side, case, algorithm, threads, options, child), daemon=True
        )
        self.proc.start()
        t0 = time.perf_counter()
        ready = self.recv()
        self.setup_s = time.perf_counter() - t0
        self.threads = int(ready["threads"])
        self.records: list[dict[str, float]] = []

    def recv(self) -> dict[str, Any]:
        message = self.conn.recv()
        if "error" in message:
            raise RuntimeError(f"{self.name}: {message['error']}")
        return message

    def step(self) -> dict[str, float]:
        self.conn.send("step")
        record = self.recv()
        record["load1"] = os.getloadavg()[0]
        self.records.append(record)
        return record

    def stop(self) -> int:
        self.conn.send("stop")
        rss = int(self.recv()["peak_rss_bytes"])
        self.proc.join(timeout=60)
        return rss
