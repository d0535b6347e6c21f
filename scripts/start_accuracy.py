"""Start accuracy of a candidate task for the SmolLM2 suite: the model as the suite's runs load it, the
task's held-out prompts rendered with its chat template, sampled as training samples them (temperature 1,
k samples) and greedily, scored by the suite's verifier; over several task seeds.

`python scripts/start_accuracy.py [--k 4] [--seeds 0 1 2] [--only LABEL ...] [--out FILE]` (from the
repository root) prints one JSON object per
candidate; docs/RESULTS.md ("How the task was chosen") quotes what it printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for a plain run

from contract.spec import TrainSpec
from trainer.evaluation import evaluate
from trainer.models import load_model_and_tokenizer
from trainer.tasks import make_train_eval


def candidate_specs() -> dict[str, dict[str, Any]]:
    """The candidates measured, each as the task/verifier/sampling part of a job spec: the bare prompt
    and the prompt with an instruction to answer with the number only, at three operand ranges."""
    from experiments.smollm2 import task_section

    out = {}
    for low, high in ((0, 20), (0, 50), (0, 99)):
        out[f"add{low}-{high}"] = task_section(low, high, "{prompt}", temperature=1.0)
        out[f"add{low}-{high}/number-only"] = task_section(low, high, temperature=1.0)
    out["add0-20/number-only/t0.7"] = task_section(0, 20)  # the suite's task
    return out


def _sum_reduce(values: list[float], _op: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def measure(spec_dict: dict[str, Any], seeds: list[int], k: int, model: Any, tok: Any) -> dict[str, Any]:
    rows = []
    for seed in seeds:
        spec = TrainSpec.model_validate({**spec_dict, "seed": seed})
        t = spec.task
        _, held_out = make_train_eval(
            t.source, name=t.name, path=t.path, size=t.train_size, eval_size=t.eval_size, seed=seed,
            params=t.params,
        )  # fmt: skip
        torch.manual_seed(seed)
        sampled = spec.model_copy(
            update={"evaluation": spec.evaluation.model_copy(update={"greedy": False, "k": k})}
        )
        greedy = spec.model_copy(update={"evaluation": spec.evaluation.model_copy(update={"greedy": True})})
        s = evaluate(model, tok, sampled, held_out, _sum_reduce)
        g = evaluate(model, tok, greedy, held_out, _sum_reduce)
        rows.append({"seed": seed, "sampled_avg": s["eval/avg@k"], "greedy": g["eval/avg@k"]})
    return {
        "seeds": rows,
        "sampled_mean": statistics.fmean(r["sampled_avg"] for r in rows),
        "greedy_mean": statistics.fmean(r["greedy"] for r in rows),
        "k": k,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/start_accuracy.py", description=__doc__)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="*", default=None, help="candidate labels (default: all)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    model, tok = load_model_and_tokenizer("smollm2-135m-instruct")
    results = {}
    for label, spec in candidate_specs().items():
        if args.only and label not in args.only:
            continue
        t0 = time.monotonic()
        results[label] = {**measure(spec, args.seeds, args.k, model, tok), "seconds": time.monotonic() - t0}
        print(json.dumps({label: results[label]}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
