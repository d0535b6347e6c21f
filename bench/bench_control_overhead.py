"""Per-step time of the PI entropy laws (docs/ALGORITHMS.md §11) against grpo_ds, side by side in one run,
on the tiny built-in model.

Each row is a whole engine step (`Engine.train_step()`: rollout, π_old, the controller's update, the loss
and the optimiser step) of its own engine on the same spec but for the algorithm. The rows' steps are
interleaved, in an order that rotates every round, so background load hits them alike; each row reports
the median and the minimum of its step times, and the ratio is median row / median grpo_ds; the paired
ratio is the median over rounds of the row's step over grpo_ds's step of the same round, with a bootstrap
95 % interval (the figure that decides the ≤ 3 % bound). Generation
is held at max_new_tokens tokens for every row (min_new_tokens), so a policy that the controller keeps
more uncertain does not make its responses longer or shorter than grpo_ds's.

The rows: grpo_ds; grpo_ds without the zero-advantage skip (what the entropy bonus's loss costs by
reaching every row, apart from the controller); entropy_pi (the default law: its actuator needs the
entropy's gradient and every row); stare_pi; clip_pi, which needs an off-policy update (its actuator is
the ratio clip: optim.ppo_epochs 2) and is set against grpo_ds at 2 epochs; entropy_split (the second-generation
law, docs/ALGORITHMS.md §12) closed loop, and held open loop on each actuator (u = +0.5: the bonus on every
step, the costly side; u = −0.5: confident-token sharpening). Also the laws alone: the time of one
`pi_step` and one `split_step`, as a share of grpo_ds's median step.

Usage: python bench/bench_control_overhead.py [--rounds 12] [--warmup 2] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common
import torch

from contract.control.pi import EntropyPiSettings, PiState, pi_step
from contract.control.split import SplitSettings, SplitState, split_step
from contract.spec import TrainSpec

OVERHEAD_TARGET = 0.03
ROWS: dict[str, dict[str, Any]] = {
    "grpo_ds": {"algorithm": {"name": "grpo_ds"}},
    "grpo_ds, no zero-advantage skip": {"algorithm": {"name": "grpo_ds"}, "skip": False},
    "entropy_pi (default law)": {"algorithm": {"control": {"target_entropy": {"relative": 0.7}}}},
    "stare_pi": {"algorithm": {"name": "stare_pi", "control": {"target_entropy": {"relative": 0.7}}}},
    "entropy_split hold": {
        "algorithm": {"name": "entropy_split", "control": {"target_entropy": {"relative": 0.7}}}
    },
    "entropy_split, bonus on (u = +0.5)": {
        "algorithm": {"name": "entropy_split", "control": {"target_entropy": 1.0, "open_loop": [[1, 0.5]]}}
    },
    "entropy_split, sharpening on (u = −0.5)": {
        "algorithm": {"name": "entropy_split", "control": {"target_entropy": 1.0, "open_loop": [[1, -0.5]]}}
    },
    "grpo_ds, 2 epochs": {"algorithm": {"name": "grpo_ds"}, "epochs": 2},
    "clip_pi (2 epochs)": {
        "algorithm": {"name": "clip_pi", "control": {"target_entropy": {"relative": 0.7}}},
        "epochs": 2,
        "against": "grpo_ds, 2 epochs",
    },
}


def spec_for(row: dict[str, Any], new_tokens: int) -> TrainSpec:
    return TrainSpec.model_validate(
        {
            "seed": 0,
            "model": {"name": "tiny-arith"},
            "task": {"source": "arithmetic", "train_size": 512, "eval_size": 8},
            "verifier": {"name": "numeric", "params": {"abs_tol": 20}},
            "algorithm": row["algorithm"],
            "sampling": {"group_size": 8, "max_new_tokens": new_tokens},
            "optim": {
                "lr": 1e-3,
                "steps": 1000,
                "prompts_per_step": 8,
                "micro_batch_size": 64,
                "skip_zero_advantage": row.get("skip", True),
                "ppo_epochs": row.get("epochs", 1),
            },
        }
    )


class Side:
    def __init__(self, spec: TrainSpec, scratch: str, new_tokens: int) -> None:
        from trainer.engine import Engine, seed_everything

        self.engine = Engine(spec, scratch, progress=False)
        seed_everything(spec.seed)
        self.engine.setup()
        model = self.engine.policy
        model.generation_config.min_new_tokens = new_tokens
        model.train()

    def step(self) -> tuple[float, dict[str, float]]:
        t0 = time.perf_counter()
        metrics = self.engine.train_step()
        return time.perf_counter() - t0, metrics


def law_seconds(calls: int = 20_000) -> float:
    p = EntropyPiSettings(target_entropy=1.0)
    state, t0 = PiState(), time.perf_counter()
    for i in range(calls):
        state = pi_step(state, 0.8 + 0.001 * (i % 100), p)
    return (time.perf_counter() - t0) / calls


def split_law_seconds(calls: int = 20_000) -> float:
    p = SplitSettings(target_entropy=1.0)
    state, t0 = SplitState(), time.perf_counter()
    for i in range(calls):
        state = split_step(state, 0.8 + 0.001 * (i % 100), p)
    return (time.perf_counter() - t0) / calls


def paired_ratio(row: list[float], against: list[float], resamples: int = 2000) -> dict[str, float]:
    """The median over rounds of the row's step over its reference's step in the same round (the two ran
    next to each other, so slow spells of the machine cancel), with a percentile-bootstrap 95 % interval
    (rounds resampled with replacement, a fixed seed): what decides a bound like ≤ 1.03."""
    ratios = [a / b for a, b in zip(row, against, strict=True)]
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return {
        "paired_ratio": statistics.median(ratios),
        "paired_low": boot[int(0.025 * resamples)],
        "paired_high": boot[int(0.975 * resamples) - 1],
    }


def cpu_model() -> tuple[str, bool]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next(
        (line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?"
    )
    return name, " avx512f" in text


def run(rounds: int, warmup: int, new_tokens: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        sides = {
            name: Side(spec_for(row, new_tokens), f"{tmp}/{i}", new_tokens)
            for i, (name, row) in enumerate(ROWS.items())
        }
        times: dict[str, list[float]] = {name: [] for name in sides}
        last: dict[str, dict[str, float]] = {}
        names = list(sides)
        for r in range(warmup + rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                seconds, metrics = sides[name].step()
                last[name] = metrics
                if r >= warmup:
                    times[name].append(seconds)
    base = statistics.median(times["grpo_ds"])
    rows = {
        name: {
            "median_s": statistics.median(ts),
            "min_s": min(ts),
            "against": ROWS[name].get("against", "grpo_ds"),
            "ratio": statistics.median(ts) / statistics.median(times[ROWS[name].get("against", "grpo_ds")]),
            **paired_ratio(ts, times[ROWS[name].get("against", "grpo_ds")]),
            "final_entropy": last[name].get("entropy/mean"),
            "final_output": last[name].get("control/output"),
        }
        for name, ts in times.items()
    }
    law, split_law = law_seconds(), split_law_seconds()
    name, avx512 = cpu_model()
    return {
        "rows": rows,
        "law_seconds": law,
        "law_share_of_grpo_ds_step": law / base,
        "split_law_seconds": split_law,
        "split_law_share_of_grpo_ds_step": split_law / base,
        "rounds": rounds,
        "warmup": warmup,
        "new_tokens": new_tokens,
        "cpu_model": name,
        "avx512": avx512,
        "machine": _common.machine(torch_threads=torch.get_num_threads()),
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| row | median step (s) | min (s) | ratio | paired ratio (95 % interval) | against |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in result["rows"].items():
        lines.append(
            f"| {name} | {row['median_s']:.4f} | {row['min_s']:.4f} | {row['ratio']:.3f} "
            f"| {row['paired_ratio']:.3f} ({row['paired_low']:.3f}–{row['paired_high']:.3f}) | {row['against']} |"
        )
    lines.append("")
    lines.append(
        f"The laws alone: pi_step {result['law_seconds'] * 1e6:.2f} µs a step "
        f"({result['law_share_of_grpo_ds_step']:.2e} of grpo_ds's step), split_step "
        f"{result['split_law_seconds'] * 1e6:.2f} µs ({result['split_law_share_of_grpo_ds_step']:.2e}). "
        f"CPU: {result['cpu_model']} "
        f"(AVX-512: {'yes' if result['avx512'] else 'no'}), {result['machine']['torch_threads']} torch threads; "
        f"{result['rounds']} rounds after {result['warmup']} warm-up; target ratio ≤ {1 + OVERHEAD_TARGET:.2f}."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help=_common.SMOKE_HELP + " (one round, one warm-up)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.warmup, args.new_tokens = 1, 1, 4
    torch.set_num_threads(args.threads)
    result = run(args.rounds, args.warmup, args.new_tokens)
    print(markdown(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
