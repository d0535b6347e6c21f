"""Start accuracy of a candidate task for the SmolLM2 suite: the model as the suite's runs load it, the
task's held-out prompts rendered with its chat template, sampled as training samples them (temperature 1,
k samples) and greedily, scored by the suite's verifier; over several task seeds.

`python scripts/start_accuracy.py [--k 4] [--seeds 0 1 2] [--only LABEL ...] [--eval-size N] [--no-greedy]
[--out FILE]` (from the repository root) prints one JSON object per candidate, with the sampled accuracy's
95 % interval over the prompts (normal approximation on the per-prompt means, every seed's prompts pooled);
docs/RESULTS.md ("How the task was chosen") and experiments/control_suite.py (the gym cell) quote what it
printed. The gym candidates (label `gym/...`) are the control-gym cell's own spec (experiments/control_suite.py:
its model, task, verifier, sampling and evaluation), sampled at the cell's temperature and k unless --k
says otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for a plain run

from contract.spec import TrainSpec
from trainer.evaluation import CHUNK_PROMPTS, eval_responses, evaluate
from trainer.models import load_model_and_tokenizer
from trainer.rollout.generation import HFGenerate
from trainer.tasks.sources import make_train_eval


def candidate_specs() -> dict[str, dict[str, Any]]:
    """The candidates measured, each as the task/verifier/sampling part of a job spec: the bare prompt
    and the prompt with an instruction to answer with the number only, at three operand ranges."""
    from experiments.smollm2 import task_section

    out = {}
    for low, high in ((0, 20), (0, 50), (0, 99)):
        out[f"add{low}-{high}"] = task_section(low, high, "{prompt}", temperature=1.0)
        out[f"add{low}-{high}/number-only"] = task_section(low, high, temperature=1.0)
    out["add0-20/number-only/t0.7"] = task_section(0, 20)  # the suite's task
    out.update(gym_candidates())
    out.update(gym2_candidates())
    return out


def gym2_candidates() -> dict[str, dict[str, Any]]:
    """The ctl2-gym2 cell's spec (experiments/control2_suite.py) and the other tasks measured for it."""
    from experiments.control2_suite import held_out_cells

    _, base, _ = held_out_cells()["ctl2-gym2"]
    cell = {key: base[key] for key in ("model", "task", "verifier", "sampling", "evaluation")}
    out = {"gym2/cell": cell}
    for label, name, params in (
        ("gym2/letter_counting-defaults", "letter_counting", {}),
        ("gym2/leg_counting-1-2", "leg_counting", {"min_animals": 1, "max_animals": 2, "max_instances": 3}),
    ):
        out[label] = {**cell, "task": {**cell["task"], "name": name, "params": params}}
    return out


def gym_candidates() -> dict[str, dict[str, Any]]:
    """The control-gym cell's spec (everything the start accuracy depends on) at chain_sum settings: the
    cell's own (GYM_TASK) and the others measured when choosing it."""
    from experiments.control_suite import GYM_TASK, _cell

    _, base, _, _ = _cell("control-gym")
    cell = {key: base[key] for key in ("model", "task", "verifier", "sampling", "evaluation")}
    chosen = GYM_TASK["task"]["params"]
    out = {"gym/cell": cell}
    for label, params in (
        ("gym/chain_sum-defaults", {}),
        ("gym/2terms-1digit", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
        ("gym/2terms-1-2digits", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
    ):
        if params != chosen:
            out[label] = {**cell, "task": {**cell["task"], "params": params}}
    return out


def interval95(values: list[float]) -> tuple[float, float]:
    """Mean ± 1.96 standard errors (the normal approximation; n is the number of prompts)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean
    half = 1.96 * statistics.stdev(values) / math.sqrt(len(values))
    return mean - half, mean + half


def _sum_reduce(values: list[float], _op: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def measure(
    spec_dict: dict[str, Any],
    seeds: list[int],
    k: int,
    model: Any,
    tok: Any,
    *,
    eval_size: int | None = None,
    greedy: bool = True,
) -> dict[str, Any]:
    rows, per_prompt = [], []
    for seed in seeds:
        task = {**spec_dict["task"], **({"eval_size": eval_size} if eval_size else {})}
        spec = TrainSpec.model_validate({**spec_dict, "task": task, "seed": seed})
        t = spec.task
        _, held_out = make_train_eval(
            t.source, name=t.name, path=t.path, size=t.train_size, eval_size=t.eval_size, seed=seed,
            params=t.params,
        )  # fmt: skip
        torch.manual_seed(seed)
        sampled = spec.model_copy(
            update={"evaluation": spec.evaluation.model_copy(update={"greedy": False, "k": k})}
        )
        means = []  # evaluate's avg@k, kept per prompt for the interval
        model.eval()
        for start in range(0, len(held_out), CHUNK_PROMPTS):
            chunk = held_out[start : start + CHUNK_PROMPTS]
            means += [
                mean for mean, _, _ in eval_responses(model, tok, sampled, chunk, k, HFGenerate(model, tok))
            ]
        per_prompt += means
        row = {"seed": seed, "prompts": len(means), "sampled_avg": statistics.fmean(means)}
        if greedy:
            g_spec = spec.model_copy(
                update={"evaluation": spec.evaluation.model_copy(update={"greedy": True})}
            )
            row["greedy"] = evaluate(
                model, tok, g_spec, held_out, _sum_reduce, engine=HFGenerate(model, tok)
            )["eval/avg@k"]
        rows.append(row)
    low, high = interval95(per_prompt)
    out = {
        "seeds": rows,
        "prompts": len(per_prompt),
        "sampled_mean": statistics.fmean(per_prompt),
        "sampled_interval95": [low, high],
        "temperature": spec_dict["evaluation"].get("temperature"),
        "max_new_tokens": spec_dict["sampling"].get("max_new_tokens"),
        "k": k,
    }
    if greedy:
        out["greedy_mean"] = statistics.fmean(r["greedy"] for r in rows)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/start_accuracy.py", description=__doc__)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="*", default=None, help="candidate labels (default: all)")
    parser.add_argument("--eval-size", type=int, default=None, help="held-out prompts per seed")
    parser.add_argument("--no-greedy", action="store_true", help="the sampled accuracy only")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    model, tok = load_model_and_tokenizer("smollm2-135m-instruct")
    results = {}
    for label, spec in candidate_specs().items():
        if args.only and label not in args.only:
            continue
        t0 = time.monotonic()
        measured = measure(
            spec, args.seeds, args.k, model, tok, eval_size=args.eval_size, greedy=not args.no_greedy
        )
        results[label] = {**measured, "seconds": time.monotonic() - t0}
        print(json.dumps({label: results[label]}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
