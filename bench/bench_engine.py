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
              (optim.skip_zero_advantage) and the glibc heap setting of trainer/run/heap.py;
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
import os
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import _common
from engine_cases import STARE_OVERHEAD_TARGET, TARGET_VS_TRL, VARIANTS, Case, default_cases, smoke_cases
from engine_report import markdown, median, summarise_side
from engine_sides import Side


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


def run_vs_trl(cases: list[Case], models: set[str], threads: int) -> list[dict[str, Any]]:
    """Part 1: every side of each case (of the models) against TRL's, interleaved."""
    vs_trl = []
    for case in (c for c in cases if c.model in models):
        print(f"- ours vs TRL: {case.label()} ({', '.join(case.variants)})", flush=True)
        sides = [(key, VARIANTS[key][1], "grpo", VARIANTS[key][2]) for key in case.variants]
        r = interleaved(case, sides, threads)
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
    return vs_trl


def run_stare(cases: list[Case], models: set[str], threads: int) -> list[dict[str, Any]]:
    """Part 2: STARE against grpo_ds on each case (of the models), both as shipped, interleaved."""
    stare = []
    for case in (c for c in cases if c.model in models):
        print(f"- STARE vs grpo_ds: {case.label()}", flush=True)
        shipped = VARIANTS["ours"][2]
        r = interleaved(
            case,
            [("grpo_ds", "ours", "grpo_ds", shipped), ("stare", "ours", "stare", shipped)],
            threads,
        )
        vs = r["ratios"]["grpo_ds"]["stare"]
        print(
            f"  STARE overhead {vs['median_pair_ratio'] - 1:+.1%} wall, "
            f"{vs['median_cpu_pair_ratio'] - 1:+.1%} CPU time (medians of pairs)",
            flush=True,
        )
        stare.append(r)
    return stare


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
    vs_trl = run_vs_trl(trl_cases, models, args.threads) if args.only in ("all", "trl") else []
    stare = run_stare(stare_cases, models, args.threads) if args.only in ("all", "stare") else []
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
