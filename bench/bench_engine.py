"""Whole-step throughput of the RL engine against TRL's GRPOTrainer, and STARE's step overhead (issue 3).

Part 1, engine vs TRL. One GRPO optimiser step on each side: sample G responses for each of P prompts with
HF generate (KV cache, no vLLM), score them with our verifier, group-normalised advantages, one
micro-batched forward/backward of the clipped loss, one AdamW step. The two sides are configured alike:

  ours: algorithm grpo (ε_low = ε_high = 0.2, seq-mean-token-mean, β = 0), ppo_epochs 1 (on-policy, so no
        π_old pass), micro_batch_size = P·G (one forward/backward per step), grad clip 1.0, AdamW
        (weight decay 0, constant lr);
  TRL:  loss_type="grpo", beta=0.0, epsilon=0.2 (epsilon_high defaults to it), num_iterations=1,
        scale_rewards="group", num_generations=G, per_device_train_batch_size = P·G,
        gradient_accumulation_steps=1, steps_per_generation=1 (one generation batch per optimiser step,
        so TRL also skips its old-log-prob pass), max_grad_norm 1.0, optim="adamw_torch" (weight decay 0,
        constant lr), entropy_coef 0, no vLLM, no logging/saving/tqdm. Two TRL defaults are turned off
        because our engine does neither: gradient_checkpointing (GRPOConfig defaults it to True) and bf16
        (GRPOConfig defaults it to True; both sides run fp32).
  Both: the same model object type and weights (load_model_and_tokenizer), the same prompts in the same
        order (the engine's seeded epoch order, fed to TRL as an unshuffled dataset), the same prompt
        rendering (plain text with <bos> for tiny-arith; the chat template for SmolLM2), temperature 1.0,
        top_p 1.0, top_k 0, the same max new tokens, and the same reward (our verifier wrapped as a TRL
        reward function): `numeric` with abs_tol 60, so that these untrained models earn mixed rewards and
        both sides take real gradient steps (an exact-match reward gives them all-zero rewards, hence
        all-zero advantages and gradients), while some groups still come out with equal rewards, as in
        real runs.

Sides (VARIANTS; tiny-arith runs all five, SmolLM2 the first two and TRL):
  ours        the engine as shipped: rows with advantage 0 scored without autograd
              (optim.skip_zero_advantage) and the glibc heap setting of trainer/heap.py;
  ours_full   every row forward and backward (skip off), heap setting on;
  ours_plain  every row forward and backward and glibc's default heap: the engine's compute path alone;
  trl         TRL as it ships;
  trl_heap    TRL with our heap setting applied to its process (what TRL would gain from it).
The headline ratio is ours against trl; the others show where the difference comes from.

Equal lengths: every response is forced to the full max_new_tokens on both sides with
`min_new_tokens = max_new_tokens` (HF's MinNewTokensLengthLogitsProcessor masks EOS until then): ours through
the model's generation_config (which our generate call inherits), TRL through `generation_kwargs`. So both
sides process exactly P·G·R response tokens per step, and the same prompts; the bench checks that the token
counts per step agree. Tokens/s = (prompt + response tokens, padding excluded) / step wall time; response
tokens/s = P·G·R / step wall time.

Timing. Each side lives in its own spawned process (same torch thread count, set before anything runs;
1 by default, see --threads) and waits for a "step" command; the parent runs rounds of one step per side,
in an order that rotates every round, so background load hits all sides alike. Ours: Engine.train_step(). TRL: from the command to the end
of that optimiser step (a TrainerCallback blocks in on_step_end), which covers the Trainer's own loop
overhead (data loading, callbacks) as well as generation and the update. Both wall time and the process's
CPU time are taken; CPU time is the steadier figure on a shared machine. The first `warmup` steps of each
side are not timed. Reported: medians, per-pair ratios (TRL time / our time: > 1 means we are faster) and
their median (the headline figure), and the load average. The two sides sample different tokens (their
RNG streams differ), which changes rewards but not the work: lengths are forced.

Part 2, STARE vs grpo_ds: the same engine and batch config; STARE with the demo's parameters (P = 0.1,
W = 1.1, M = 0.9, O1) and its gate forced on (target entropy 100, so every step ranks tokens: the costly
case), against grpo_ds (the loss STARE reweights). Each runs in its own process (so ru_maxrss is that
configuration's peak RSS), steps interleaved the same way. Overhead = median over pairs of
STARE time / grpo_ds time − 1.

Run: PYTHONPATH=. .venv/bin/python bench/bench_engine.py [--quick] [--json bench/results/engine.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import _common

TARGET_VS_TRL = {"tiny-arith": 1.5, "smollm2-135m-instruct": 1.2}
STARE_OVERHEAD_TARGET = 0.03
STARE_PARAMS = {"top_ratio": 0.1, "reweight_w": 1.1, "reweight_m": 0.9, "variant": "O1"}
STARE_GATE_TARGET = 100.0

# The sides of the comparison with TRL: (label, trainer, options). "heap": the engine's glibc heap setting
# (trainer/heap.py; on by default in our engine, off by default in any other process); "skip": scoring
# rows with advantage 0 without autograd (optim.skip_zero_advantage, on by default).
VARIANTS: dict[str, tuple[str, str, dict[str, bool]]] = {
    "ours": ("ours (grpo), as shipped", "ours", {"heap": True, "skip": True}),
    "ours_full": ("ours, every row forward+backward", "ours", {"heap": True, "skip": False}),
    "ours_plain": ("ours, every row, glibc default heap", "ours", {"heap": False, "skip": False}),
    "trl": ("TRL GRPOTrainer", "trl", {"heap": False}),
    "trl_heap": ("TRL GRPOTrainer, our heap setting", "trl", {"heap": True}),
}


@dataclass(frozen=True)
class Case:
    """One batch configuration, measured on both sides of a comparison."""

    model: str
    prompts: int  # P
    samples: int  # G
    new_tokens: int  # R (forced: every response is exactly this long)
    chat: bool  # render prompts with the tokenizer's chat template
    verifier: str
    lr: float
    warmup: int  # untimed steps per side
    steps: int  # timed steps per side
    seed: int = 0
    verifier_params: tuple[tuple[str, Any], ...] = ()
    variants: tuple[str, ...] = ("ours", "ours_full", "trl")  # sides of the comparison with TRL

    @property
    def responses(self) -> int:
        return self.prompts * self.samples

    def label(self) -> str:
        return f"{self.model}, {self.prompts} prompts × {self.samples} samples × {self.new_tokens} tokens"


def default_cases(quick: bool) -> tuple[list[Case], list[Case]]:
    # A numeric reward with a tolerance: an untrained model's answers then earn mixed rewards, so both
    # trainers take real gradient steps (an exact-match reward gives these models all-zero rewards, i.e.
    # all-zero advantages and gradients), and some groups still come out all-equal, as in real runs.
    loose = (("abs_tol", 60.0),)
    tiny = Case(
        "tiny-arith",
        8,
        8,
        16,
        False,
        "numeric",
        2e-4,
        warmup=3,
        steps=20,
        verifier_params=loose,
        variants=tuple(VARIANTS),
    )
    smol = Case(
        "smollm2-135m-instruct", 4, 4, 16, True, "numeric", 1e-6, warmup=1, steps=5, verifier_params=loose
    )
    if quick:
        tiny = replace(tiny, warmup=1, steps=3)
        smol = replace(smol, warmup=1, steps=1)
        return [tiny, smol], [tiny]
    # About 7 minutes on 2 loaded cores; SmolLM2 steps dominate (~25 s per pair against TRL).
    return [tiny, smol], [tiny, replace(smol, steps=4)]


# ------------------------------------------------------------------------------------------ both sides


def train_spec(case: Case, algorithm: str, skip_zero_advantage: bool = True) -> Any:
    from contract.spec import TrainSpec

    algo: dict[str, Any] = {"name": algorithm}
    if algorithm == "stare":
        # The gate is forced on (H̄ < 100 always), so every step pays for the surprisal ranking: the worst
        # case for the overhead. With the demo's target (0.3) an untrained model's gate would stay off.
        algo.update(params=STARE_PARAMS, gate={"target_entropy": STARE_GATE_TARGET})
    return TrainSpec.model_validate(
        {
            "name": f"bench-{algorithm}",
            "seed": case.seed,
            "model": {"name": case.model},
            "task": {
                "source": "arithmetic",
                "params": {"operations": ["+"], "min_operand": 0, "max_operand": 99},
                "train_size": 2000,
                "eval_size": 0,
                "use_chat_template": case.chat,
            },
            "verifier": {"name": case.verifier, "params": dict(case.verifier_params)},
            "algorithm": algo,
            "sampling": {
                "group_size": case.samples,
                "temperature": 1.0,
                "top_p": 1.0,
                "max_new_tokens": case.new_tokens,
            },
            "optim": {
                "lr": case.lr,
                "steps": case.warmup + case.steps,
                "prompts_per_step": case.prompts,
                "micro_batch_size": case.responses,
                "grad_clip": 1.0,
                "ppo_epochs": 1,
                "kl_beta": 0.0,
                "skip_zero_advantage": skip_zero_advantage,
            },
        }
    )


def engine_prompt_order(spec: Any, steps: int) -> list[Any]:
    """The examples the engine takes over `steps` steps, in order, via its own data cursor."""
    from trainer.data import load_examples

    prompts, _ = load_examples(spec)  # the engine's data cursor, without an engine
    order: list[Any] = []
    for _ in range(steps):
        order.extend(prompts.take(spec.optim.prompts_per_step)[0])
    return order


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
    from trainer.tasks import Example
    from trainer.verifiers import score, shape_reward

    def reward(prompts: list[Any], completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[0]["content"] if chat else c for c in completions]
        return [
            shape_reward(score(verifier, t, Example(prompt="", answer=a), params), "binary")
            for t, a in zip(texts, answer)
        ]

    reward.__name__ = f"verifier_{verifier}"
    return reward


def run_trl(case: Case, conn: Connection, scratch: str) -> None:
    """Drives GRPOTrainer.train(); a callback hands control to the parent after every optimiser step."""
    import datasets
    import torch
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    from trainer.models import load_model_and_tokenizer
    from trainer.tasks import render_prompt

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
    config = GRPOConfig(
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

    handoff = Handoff()
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
    # Before anything allocates: the heap setting is per process (trainer/heap.py reads the variable when
    # the engine starts; the TRL side applies it here).
    os.environ["STARE_HEAP_TUNING"] = "1" if options.get("heap", False) else "0"
    import torch

    from trainer import heap

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


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarise_side(side: Side, warmup: int, rss: int) -> dict[str, Any]:
    timed = side.records[warmup:]
    seconds = [r["seconds"] for r in timed]
    cpu = [r["cpu_seconds"] for r in timed]
    return {
        "setup_s": side.setup_s,
        "torch_threads": side.threads,
        "step_s": seconds,
        "median_step_s": median(seconds),
        "min_step_s": min(seconds) if seconds else float("nan"),
        "cpu_step_s": cpu,
        "median_cpu_step_s": median(cpu),
        "median_generation_s": median([r["generation_seconds"] for r in timed]),
        "median_update_s": median([r["update_seconds"] for r in timed]),
        "tokens_per_step": median([r["tokens"] for r in timed]),
        "response_tokens_per_step": median([r["response_tokens"] for r in timed]),
        "tokens_per_s": median([r["tokens"] / r["seconds"] for r in timed]),
        "response_tokens_per_s": median([r["response_tokens"] / r["seconds"] for r in timed]),
        "peak_rss_bytes": rss,
        **(
            {"zero_std_fraction": median([r["zero_std_fraction"] for r in timed])}
            if "zero_std_fraction" in timed[0]
            else {}
        ),
        **({"gate_on_fraction": median([r["gate_on"] for r in timed])} if "gate_on" in timed[0] else {}),
    }


def interleaved(
    case: Case, sides: list[tuple[str, str, str, dict[str, bool]]], threads: int
) -> dict[str, Any]:
    """Starts every side (key, trainer, algorithm, options), then runs rounds of one step per side, in an
    order that rotates each round; returns each side's summary under its key, and the per-round ratios
    `ratios[a][b]` = (b's step time / a's step time) for every pair of sides."""
    load_before = os.getloadavg()
    procs = {
        key: Side(key, trainer, case, algorithm, threads, options)
        for key, trainer, algorithm, options in sides
    }
    keys = list(procs)
    t0 = time.perf_counter()
    for i in range(case.warmup + case.steps):
        order = keys[i % len(keys) :] + keys[: i % len(keys)]
        records = {key: procs[key].step() for key in order}
        tag = "warm-up" if i < case.warmup else "timed"
        times = ", ".join(f"{key} {records[key]['seconds']:.3f} s" for key in keys)
        print(f"    step {i + 1} ({tag}): {times}, load {os.getloadavg()[0]:.2f}", flush=True)
    loop_s = time.perf_counter() - t0
    rss = {key: procs[key].stop() for key in keys}
    summaries = {key: summarise_side(procs[key], case.warmup, rss[key]) for key in keys}
    ratios: dict[str, dict[str, Any]] = {}
    for a in keys:
        ratios[a] = {}
        for b in keys:
            if a == b:
                continue
            sa, sb = summaries[a], summaries[b]
            pairs = [y / x for x, y in zip(sa["step_s"], sb["step_s"])]
            cpu_pairs = [y / x for x, y in zip(sa["cpu_step_s"], sb["cpu_step_s"])]
            ratios[a][b] = {
                "pair_ratios": pairs,
                "median_pair_ratio": median(pairs),
                "quartiles": statistics.quantiles(pairs, n=4) if len(pairs) > 1 else pairs,
                "ratio_of_medians": sb["median_step_s"] / sa["median_step_s"],
                "median_cpu_pair_ratio": median(cpu_pairs),
            }
    loads = [r["load1"] for key in keys for r in procs[key].records[case.warmup :]]
    return {
        "case": asdict(case),
        "label": case.label(),
        "sides": summaries,
        "ratios": ratios,
        "load_average_before": list(load_before),
        "load1_during": {"min": min(loads), "median": median(loads), "max": max(loads)},
        "loop_s": loop_s,
    }


def fmt_rss(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def markdown(vs_trl: list[dict[str, Any]], stare: list[dict[str, Any]]) -> str:
    lines = [
        "| model, batch | side | median step, wall (s) | generation / update (s) | median step, CPU (s) "
        "| tokens/step (response) | tokens/s | peak RSS | groups with equal rewards "
        "| speed-up vs TRL, wall: median of pairs (of medians) [quartiles] | CPU time "
        "| vs TRL with our heap setting | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in vs_trl:
        target = TARGET_VS_TRL.get(r["case"]["model"], float("nan"))
        for n, key in enumerate(r["case"]["variants"]):
            s = r["sides"][key]
            zero = f"{s['zero_std_fraction']:.0%}" if "zero_std_fraction" in s else ""
            cells = [
                r["label"] if n == 0 else "",
                VARIANTS[key][0],
                f"{s['median_step_s']:.3f}",
                f"{s['median_generation_s']:.3f} / {s['median_update_s']:.3f}",
                f"{s['median_cpu_step_s']:.3f}",
                f"{s['tokens_per_step']:.0f} ({s['response_tokens_per_step']:.0f})",
                f"{s['tokens_per_s']:.0f}",
                fmt_rss(s["peak_rss_bytes"]),
                zero,
            ]
            vs = r["ratios"].get(key, {}).get("trl")
            if VARIANTS[key][1] == "ours" and vs is not None:
                q = vs["quartiles"]
                cells += [
                    f"**{vs['median_pair_ratio']:.2f}×** ({vs['ratio_of_medians']:.2f}×) "
                    f"[{q[0]:.2f} / {q[len(q) // 2]:.2f} / {q[-1]:.2f}]",
                    f"{vs['median_cpu_pair_ratio']:.2f}×",
                ]
                heap_vs = r["ratios"][key].get("trl_heap")
                cells.append(f"{heap_vs['median_pair_ratio']:.2f}×" if heap_vs else "")
                if key == "ours":
                    cells += [f"≥ {target}×", "yes" if vs["median_pair_ratio"] >= target else "no"]
                else:
                    cells += ["", ""]
            else:
                cells += ["", "", "", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| model, batch | algorithm | median step, wall (s) | generation / update (s) | median step, CPU (s) "
        "| peak RSS | STARE overhead, wall: median of pairs (of medians) | overhead, CPU time | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in stare:
        vs = r["ratios"]["grpo_ds"]["stare"]
        over = vs["median_pair_ratio"] - 1
        for algo in ("grpo_ds", "stare"):
            s = r["sides"][algo]
            gate = f" (gate on in {s['gate_on_fraction']:.0%} of steps)" if "gate_on_fraction" in s else ""
            lines.append(
                f"| {r['label'] if algo == 'grpo_ds' else ''} | {algo}{gate} | {s['median_step_s']:.3f} "
                f"| {s['median_generation_s']:.3f} / {s['median_update_s']:.3f} | {s['median_cpu_step_s']:.3f} "
                f"| {fmt_rss(s['peak_rss_bytes'])} "
                + (
                    f"| **{over:+.1%}** ({vs['ratio_of_medians'] - 1:+.1%}) "
                    f"| {vs['median_cpu_pair_ratio'] - 1:+.1%} | ≤ +3 % "
                    f"| {'yes' if over <= STARE_OVERHEAD_TARGET else 'no'} |"
                    if algo == "stare"
                    else "| | | | |"
                )
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few steps (about 2 minutes)")
    parser.add_argument(
        "--json", default=str(_common.ROOT / "bench" / "results" / "engine.json"), help="output path"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads on every side (default 1: on a shared 2-core machine 2 threads per process stall "
        "on each other and on other jobs)",
    )
    parser.add_argument(
        "--only", choices=("all", "trl", "stare"), default="all", help="run only one part of the benchmark"
    )
    parser.add_argument(
        "--without-trl",
        action="store_true",
        help="leave TRL's sides out (a machine without trl): our sides and the STARE overhead only",
    )
    parser.add_argument("--steps", type=int, default=None, help="timed steps per side (default: per case)")
    parser.add_argument(
        "--models",
        default="tiny-arith,smollm2-135m-instruct",
        help="comma-separated models to include (tiny-arith, smollm2-135m-instruct)",
    )
    parser.add_argument("--smoke", action="store_true", help=_common.SMOKE_HELP)
    return parser.parse_args(argv)


def smoke_cases(trl_cases: list[Case], stare_cases: list[Case]) -> tuple[list[Case], list[Case]]:
    """--smoke: tiny-arith only, one untimed and one timed step, our shipped side against TRL's."""
    tiny = [replace(c, warmup=1, steps=1) for c in trl_cases if c.model == "tiny-arith"]
    return [replace(c, variants=("ours", "trl")) for c in tiny], [
        replace(c, warmup=1, steps=1) for c in stare_cases if c.model == "tiny-arith"
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    models = {m.strip() for m in args.models.split(",") if m.strip()}
    trl_cases, stare_cases = default_cases(args.quick)
    if args.smoke:
        trl_cases, stare_cases = smoke_cases(trl_cases, stare_cases)
    if args.steps is not None:
        trl_cases = [replace(c, steps=args.steps) for c in trl_cases]
        stare_cases = [replace(c, steps=args.steps) for c in stare_cases]
    if args.without_trl:
        trl_cases = [
            replace(c, variants=tuple(v for v in c.variants if VARIANTS[v][1] != "trl")) for c in trl_cases
        ]
    started = time.perf_counter()
    packages = ("transformers", "accelerate") if args.without_trl else ("transformers", "accelerate", "trl")
    info = _common.machine(*packages, torch_threads=args.threads)
    print(
        f"bench_engine: {info['cpu_count']} CPUs, torch {info['torch']} ({args.threads} threads), "
        f"trl {info.get('trl', 'left out')}, load average {os.getloadavg()}",
        flush=True,
    )
    vs_trl, stare = [], []
    if args.only in ("all", "trl"):
        for case in (c for c in trl_cases if c.model in models):
            print(f"- ours vs TRL: {case.label()} ({', '.join(case.variants)})", flush=True)
            sides = [(key, VARIANTS[key][1], "grpo", VARIANTS[key][2]) for key in case.variants]
            r = interleaved(case, sides, args.threads)
            tokens = {key: r["sides"][key]["tokens_per_step"] for key in case.variants}
            if len(set(tokens.values())) != 1:
                print(f"  WARNING: tokens per step differ: {tokens}", flush=True)
            for key in case.variants:
                vs = r["ratios"][key].get("trl")
                if VARIANTS[key][1] == "ours" and vs is not None:
                    print(
                        f"  {key}: {vs['median_pair_ratio']:.2f}× TRL wall, {vs['median_cpu_pair_ratio']:.2f}× "
                        "CPU time (medians of pairs)",
                        flush=True,
                    )
            vs_trl.append(r)
    if args.only in ("all", "stare"):
        for case in (c for c in stare_cases if c.model in models):
            print(f"- STARE vs grpo_ds: {case.label()}", flush=True)
            shipped = VARIANTS["ours"][2]
            r = interleaved(
                case,
                [("grpo_ds", "ours", "grpo_ds", shipped), ("stare", "ours", "stare", shipped)],
                args.threads,
            )
            vs = r["ratios"]["grpo_ds"]["stare"]
            print(
                f"  STARE overhead {vs['median_pair_ratio'] - 1:+.1%} wall, "
                f"{vs['median_cpu_pair_ratio'] - 1:+.1%} CPU time (medians of pairs)",
                flush=True,
            )
            stare.append(r)
    table = markdown(vs_trl, stare)
    elapsed = time.perf_counter() - started
    print()
    print(table)
    print(f"\nwall time {elapsed:.0f} s, load average now {os.getloadavg()}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "engine",
                "command": " ".join(sys.argv),
                "quick": args.quick,
                "smoke": args.smoke,
                "machine": info,
                "targets": {"speedup_vs_trl": TARGET_VS_TRL, "stare_overhead_max": STARE_OVERHEAD_TARGET},
                "vs_trl": vs_trl,
                "stare_vs_grpo_ds": stare,
                "markdown": table,
                "wall_time_s": elapsed,
                "load_average_end": list(os.getloadavg()),
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
