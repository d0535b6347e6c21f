"""Tenant graders: the warm pool against a fresh sandbox per sample, and grading's share of the demo's step.

1. Throughput, side by side, on the same samples with the same python grader (examples/graders: the
   numeric verifier re-implemented): samples/s of the job's warm pool (its processes load the source once,
   then grade over a pipe; 1 and 2 processes) against the baseline, a fresh sandbox per sample (start,
   load the source, grade one sample, end it: what a pool spares); and, for scale, the built-in numeric
   verifier on the same samples in this process (the reward logic alone, no sandbox).
2. The demo's step time (trainer/specs/demo.yaml, a short SFT, then RL steps), rewarded by the built-in
   `numeric` verifier and by that grader in its pool: grader/step_share (grading seconds over the step's)
   and the median step time of each, measured in one process one after the other. The goal is a share
   ≤ 5 % (docs/BENCHMARKS.md).

    python bench/bench_graders.py --json bench/results/graders.json     (about 3 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import _common
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _grader() -> Any:
    from contract.graders import parse_grader

    return parse_grader(json.loads((ROOT / "examples" / "graders" / "grader.json").read_text()))


def _samples(count: int) -> tuple[list[str], list[dict[str, Any]]]:
    rows = [
        json.loads(line) for line in (ROOT / "examples" / "graders" / "rows.jsonl").read_text().splitlines()
    ]
    texts, items = [], []
    for index in range(count):
        row = rows[index % len(rows)]
        answer = row["answer"] if index % 3 else str(int(row["answer"]) + 1)  # some right, some wrong
        texts.append(answer)
        items.append({**row["meta"], "prompt": row["prompt"], "answer": row["answer"]})
    return texts, items


def throughput(pool_samples: int, fresh_samples: int, rounds: int) -> dict[str, Any]:
    from contract.graders import GraderLimitsSpec
    from trainer.graders.grading import Grader

    grader, limits = _grader(), GraderLimitsSpec(timeout_s=30, memory_mb=1024)
    result: dict[str, Any] = {"pool_samples": pool_samples, "fresh_samples": fresh_samples, "rounds": rounds}
    for workers in (1, 2):
        texts, items = _samples(pool_samples)
        started = time.perf_counter()
        warm = Grader.start(grader, limits, workers)
        start_s = time.perf_counter() - started
        rates = []
        try:
            for _ in range(rounds):
                begin = time.perf_counter()
                outcomes = warm.grade(texts, items)
                rates.append(len(texts) / (time.perf_counter() - begin))
                assert all(o.ok for o in outcomes), [o for o in outcomes if not o.ok][:1]
        finally:
            warm.close()
        result[f"pool_{workers}"] = {"samples_per_s": statistics.median(rates), "start_s": start_s}
    texts, items = _samples(fresh_samples)
    begin = time.perf_counter()
    for text, item in zip(texts, items):
        fresh = Grader.start(grader, limits, 1)
        try:
            assert fresh.grade([text], [item])[0].ok
        finally:
            fresh.close()
    result["fresh_sandbox_per_sample"] = {"samples_per_s": fresh_samples / (time.perf_counter() - begin)}
    result["verifier_in_process"] = {"samples_per_s": _verifier_rate(pool_samples, rounds)}
    baseline = result["fresh_sandbox_per_sample"]["samples_per_s"]
    result["pool_1_over_fresh"] = result["pool_1"]["samples_per_s"] / baseline
    result["pool_2_over_fresh"] = result["pool_2"]["samples_per_s"] / baseline
    return result


def _verifier_rate(count: int, rounds: int) -> float:
    """samples/s of the built-in numeric verifier in this process on the same samples: the cost of the
    reward's own logic, without a sandbox (what the grader re-implements)."""
    from trainer.tasks import verifiers
    from trainer.tasks.sources import Example

    texts, items = _samples(count)
    examples = [Example(item["prompt"], item["answer"]) for item in items]
    rates = []
    for _ in range(rounds):
        begin = time.perf_counter()
        for text, example in zip(texts, examples):
            verifiers.score("numeric", text, example)
        rates.append(count / (time.perf_counter() - begin))
    return statistics.median(rates)


def _demo(steps: int, sft_steps: int, **changes: Any) -> Any:
    from contract.spec import TrainSpec

    data = yaml.safe_load((ROOT / "trainer" / "specs" / "demo.yaml").read_text())
    data["optim"]["steps"], data["sft"]["steps"] = steps, sft_steps
    data["task"]["eval_size"] = 0
    data["evaluation"] = {"interval": 0}
    data["checkpoint"] = {"interval": max(steps, 1), "keep_last": 1}
    data.pop("verifier")
    data.update(changes)
    return TrainSpec.model_validate(data)


def step_share(steps: int, sft_steps: int) -> dict[str, Any]:
    from trainer.engine import Engine

    grader = json.loads((ROOT / "examples" / "graders" / "grader.json").read_text())
    sides = {
        "verifier": _demo(steps, sft_steps, verifier={"name": "numeric"}),
        "grader": _demo(steps, sft_steps, grader=grader, grading={"workers": 2, "limits": {"timeout_s": 30}}),
    }
    out: dict[str, Any] = {"steps": steps, "sft_steps": sft_steps}
    for name, spec in sides.items():
        with tempfile.TemporaryDirectory() as folder:
            assert Engine(spec, folder, progress=False).run() == 0
            events = [json.loads(line) for line in (Path(folder) / "events.jsonl").read_text().splitlines()]
        metrics = [e["metrics"] for e in events if e["type"] == "step"][1:]  # the first step warms caches
        out[name] = {"median_step_s": statistics.median(m["perf/step_seconds"] for m in metrics)}
        if name == "grader":
            out[name]["median_grading_s"] = statistics.median(m["grader/seconds"] for m in metrics)
            out[name]["median_step_share"] = statistics.median(m["grader/step_share"] for m in metrics)
            out[name]["max_step_share"] = max(m["grader/step_share"] for m in metrics)
            out[name]["samples_per_step"] = metrics[-1]["grader/samples"]
    out["step_time_ratio_grader_over_verifier"] = (
        out["grader"]["median_step_s"] / out["verifier"]["median_step_s"]
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool-samples", type=int, default=2048)
    parser.add_argument("--fresh-samples", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sft-steps", type=int, default=100)
    parser.add_argument("--json", help="write the result here too")
    parser.add_argument("--smoke", action="store_true", help=_common.SMOKE_HELP)
    args = parser.parse_args(argv)
    _common.apply_smoke(args, pool_samples=64, fresh_samples=3, rounds=1, steps=3, sft_steps=5)
    result = {
        "machine": _common.machine(),
        "smoke": args.smoke,
        "throughput": throughput(args.pool_samples, args.fresh_samples, args.rounds),
        "step_share": step_share(args.steps, args.sft_steps),
    }
    _common.emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
