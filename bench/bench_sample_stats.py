"""What reading per-token statistics off generation saves the update (issue 3), in-process A/B.

Rollouts can record each sampled token's log-prob, entropy and C(p) from the logits generate's own forward
passes compute (`SampledTokenStats` in trainer/rollout/batch.py). The engine then (a) leaves rows with advantage 0
out of every forward (without the record they take a forward without autograd), and (b) gives on-policy
STARE over several micro-batches its π_old without a separate no-grad pass over the batch.

One engine per configuration; its steps alternate between the record on and off (the order flips every
round), so both modes see the same model, data stream and host load. Lengths are forced to the budget
(min_new_tokens), as in bench_engine.py. Reported: median step and update time per mode and their ratio.

Configurations (tiny-arith, 8 prompts × 8 samples × 16 tokens, the bench_engine batch):
  grpo, one micro-batch      the bench_engine "ours" side: only (a) applies;
  stare, 4 micro-batches     the gate forced on (every step ranks tokens): (a) and (b).

Run: PYTHONPATH=. .venv/bin/python bench/bench_sample_stats.py [--rounds 50] [--json bench/results/sample_stats.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import _common  # puts the repository root on sys.path
import torch
from engine_cases import default_cases, train_spec


def engine_for(algorithm: str, micro_batch: int | None) -> Any:
    from trainer.engine import Engine, seed_everything

    case = default_cases(quick=False)[0][0]
    spec = train_spec(case, algorithm)
    if micro_batch is not None:
        spec = spec.model_copy(
            update={"optim": spec.optim.model_copy(update={"micro_batch_size": micro_batch})}
        )
    engine = Engine(spec, tempfile.mkdtemp(prefix="bench-sample-stats-"), progress=False)
    seed_everything(spec.seed)
    engine.setup()
    model = engine.policy
    model.generation_config.min_new_tokens = case.new_tokens  # equal lengths, as in bench_engine
    model.train()
    assert engine.record_sample_stats, "this configuration does not record sampling statistics"
    return engine


def measure(name: str, algorithm: str, micro_batch: int | None, rounds: int, warmup: int) -> dict[str, Any]:
    engine = engine_for(algorithm, micro_batch)
    for _ in range(warmup):
        engine.train_step()
    times: dict[bool, list[float]] = {True: [], False: []}
    updates: dict[bool, list[float]] = {True: [], False: []}
    for i in range(rounds):
        for record in (True, False) if i % 2 else (False, True):
            engine.record_sample_stats = record
            t0 = time.perf_counter()
            metrics = engine.train_step()
            times[record].append(time.perf_counter() - t0)
            updates[record].append(metrics["perf/update_seconds"])
    step_on, step_off = statistics.median(times[True]), statistics.median(times[False])
    result = {
        "config": name,
        "rounds": rounds,
        "step_seconds_record": step_on,
        "step_seconds_no_record": step_off,
        "update_seconds_record": statistics.median(updates[True]),
        "update_seconds_no_record": statistics.median(updates[False]),
        "speedup": step_off / step_on,
    }
    print(
        f"{name}: step {step_on * 1e3:.1f} ms with the record, {step_off * 1e3:.1f} ms without "
        f"({result['speedup']:.2f}×); update {result['update_seconds_record'] * 1e3:.1f} / "
        f"{result['update_seconds_no_record'] * 1e3:.1f} ms",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help=_common.SMOKE_HELP)
    args = parser.parse_args()
    _common.apply_smoke(args, rounds=2, warmup=0)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    results = [
        measure("tiny-arith grpo, one micro-batch", "grpo", None, args.rounds, args.warmup),
        measure("tiny-arith stare (gate on), 4 micro-batches", "stare", 16, args.rounds, args.warmup),
    ]
    summary = {
        "torch": torch.__version__,
        "threads": args.threads,
        "load_average": os.getloadavg(),
        "wall_seconds": time.perf_counter() - started,
        "results": results,
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
