"""Rollouts on vLLM against HF generate: tokens/s of the rollout and the whole RL step, as ratios in one run.

    .venv-vllm/bin/python -m bench.bench_rollout [--model tiny-arith|smollm2-135m-instruct] [--repeats 3]

Runs in vLLM's environment (`make install` builds .venv-vllm). Each engine is warmed up once per shape
first (vLLM's first call per shape is slow); then the median of `repeats` timings. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from contract.spec import TrainSpec
from trainer.engine import Engine

PROMPTS = 4
SAMPLES = 8
NEW_TOKENS = 32


def _spec(model: str, engine: str) -> TrainSpec:
    return TrainSpec.model_validate(
        {
            "model": {"name": model},
            "task": {"source": "arithmetic", "train_size": 64, "eval_size": 4},
            "rollout": {"engine": engine},
            "sampling": {"group_size": SAMPLES, "max_new_tokens": NEW_TOKENS},
            "optim": {"steps": 100, "prompts_per_step": PROMPTS, "micro_batch_size": 32},
        }
    )


def measure(model: str, engine_name: str, repeats: int, out: str) -> dict[str, float]:
    engine = Engine(_spec(model, engine_name), out, progress=False)
    engine.setup()
    ids, mask = engine.tokenizer(
        ["12+34=", "5+6=", "99+1=", "7+70="], return_tensors="pt", padding=True
    ).values()
    rollout_s, tokens, step_s = [], [], []
    engine.policy.eval()
    for i in range(repeats + 1):
        t = time.perf_counter()
        g = engine.rollout_engine.generate(
            ids, mask, num_samples=SAMPLES, temperature=1.0, top_p=1.0, max_new_tokens=NEW_TOKENS
        )
        if i:  # the first call warms the shape up
            rollout_s.append(time.perf_counter() - t)
            tokens.append(float(g.response_mask.sum()))
    engine.policy.train()
    for i in range(repeats + 1):
        t = time.perf_counter()
        engine.train_step()
        if i:
            step_s.append(time.perf_counter() - t)
    return {
        "rollout_tokens_per_s": statistics.median(n / s for n, s in zip(tokens, rollout_s)),
        "step_s": statistics.median(step_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-arith")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the result here")
    parser.add_argument(
        "--smoke", action="store_true", help="a smoke run: one timing per engine (tests/bench runs it)"
    )
    args = parser.parse_args()
    if args.smoke:
        args.repeats = 1
    torch.manual_seed(0)
    import tempfile

    with tempfile.TemporaryDirectory() as hf_out, tempfile.TemporaryDirectory() as vllm_out:
        hf = measure(args.model, "hf", args.repeats, hf_out)
        print(json.dumps({"hf": hf}), file=sys.stderr, flush=True)  # progress: a long run keeps it
        fast = measure(args.model, "vllm", args.repeats, vllm_out)
        print(json.dumps({"vllm": fast}), file=sys.stderr, flush=True)
    result = {
        "model": args.model,
        "shape": f"{PROMPTS} prompts x {SAMPLES} samples x <= {NEW_TOKENS} tokens",
        "hf": hf,
        "vllm": fast,
        "rollout_tokens_per_s_ratio": fast["rollout_tokens_per_s"] / hf["rollout_tokens_per_s"],
        "step_time_ratio": fast["step_s"] / hf["step_s"],
    }
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh)


if __name__ == "__main__":
    main()
