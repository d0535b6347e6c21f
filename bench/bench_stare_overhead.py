"""Time overhead of the STARE loss (weights ω from the surprisal ranking, then the weighted grpo_ds loss)
over the grpo_ds loss on the same batch (STARE, ALGORITHMS.md §5; issue 2).

What one timed call does, for each loss: a fresh leaf copy of the per-token log-probs (B, T) that
requires grad, `compute_policy_loss(name, ...)` (forward, metrics included), and `loss.backward()`.
The batch is the official setup's shape: 64 prompts × 8 samples × 1,024 response tokens, response
lengths drawn uniformly from [64, 1024] (right padding masked out), binary rewards (p = 0.5) turned into
GRPO advantages by `compute_advantages("grpo", ...)`, old log-probs −6·u³ (u ~ U(0, 1): most tokens
confident, a tail of surprising ones) and current log-probs the old ones plus N(0, 0.05²) noise.

STARE runs with the gate on (the case that ranks tokens), variant O1 and P = 0.1 over the micro-batch
scope; C2 (which ranks T⁻ as well) and gate off are extra rows. The calls of all rows are interleaved
(ABAB...), so background load hits them alike; each row reports the median and the minimum over the
calls, and the overhead is (median STARE − median grpo_ds) / median grpo_ds.

Before timing, two checks: with the gate off STARE's loss and gradient equal grpo_ds's bit for bit, and
the bounded top-k that STARE's selection uses picks exactly the tokens a full stable argsort picks.

The loss-only ratio is the one the ≤ 3 % target is judged on. For scale, the same extra time is also
given as a share of the chunked log-prob kernel's forward + backward over the batch's active tokens
(V = 151,936, bf16 logits, measured here on a slice and scaled linearly), which every step pays before
the loss and which the model's own forward and backward dwarf in turn.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _common
import torch
from torch import Tensor

from trainer.algos import (
    PolicyLossInputs,
    compute_advantages,
    compute_policy_loss,
    make_loss_params,
    token_stats_from_logits,
)
from trainer.algos.selection import (
    broadcast_advantages,
    ceil_count,
    ceil_count_bound,
    top_k_mask,
)
from trainer.algos.stare import StareControllerState

OVERHEAD_TARGET = 0.03


@dataclass(frozen=True)
class Settings:
    prompts: int
    samples: int
    response_tokens: int
    repeats: int
    warmup: int
    kernel_rows: int
    vocab: int
    seed: int = 0


@dataclass(frozen=True)
class Batch:
    logprob: Tensor  # (B, T) fp32, detached; each call makes a leaf copy
    old_logprob: Tensor  # (B, T)
    advantages: Tensor  # (B,)
    response_mask: Tensor  # (B, T)


def make_batch(s: Settings) -> Batch:
    gen = torch.Generator().manual_seed(s.seed)
    n = s.prompts * s.samples
    t = s.response_tokens
    lengths = torch.randint(min(64, t), t + 1, (n,), generator=gen)  # (B,)
    response_mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).float()  # (B, T)
    rewards = (torch.rand(n, generator=gen) < 0.5).float()  # (B,)
    group_ids = torch.arange(n) // s.samples
    advantages, _ = compute_advantages("grpo", rewards, group_ids)  # (B,)
    old_logprob = -6.0 * torch.rand((n, t), generator=gen).pow(3)  # (B, T)
    logprob = old_logprob + 0.05 * torch.randn((n, t), generator=gen)
    return Batch(logprob, old_logprob, advantages, response_mask)


GATE_ON = StareControllerState(gate_on=True, reweight_w=1.1, reweight_m=0.9)
GATE_OFF = StareControllerState(gate_on=False, reweight_w=1.1, reweight_m=0.9)
# label → (loss, parameter overrides, the controller state the loss is given)
VARIANTS: dict[str, tuple[str, dict[str, Any], Any]] = {
    "grpo_ds": ("grpo_ds", {}, None),
    "stare O1 (gate on)": ("stare", {"variant": "O1"}, GATE_ON),
    "stare C2 (gate on)": ("stare", {"variant": "C2"}, GATE_ON),
    "stare (gate off)": ("stare", {"variant": "O1"}, GATE_OFF),
}


def one_call(batch: Batch, loss_name: str, params: Any, control: Any = None) -> float:
    start = time.perf_counter()
    logprob = batch.logprob.clone().requires_grad_(True)  # (B, T) leaf
    inputs = PolicyLossInputs(
        logprob=logprob,
        old_logprob=batch.old_logprob,
        advantages=batch.advantages,
        response_mask=batch.response_mask,
    )
    loss, _ = compute_policy_loss(loss_name, inputs, params, control=control)
    loss.backward()
    return time.perf_counter() - start


def check_stare_matches_grpo_ds_when_neutral(batch: Batch) -> None:
    """Sanity: with the gate off, STARE's loss and gradient are grpo_ds's bit for bit (ALGORITHMS §7.9),
    so the two rows time the same arithmetic plus STARE's bookkeeping."""
    results = []
    for name, control in (("grpo_ds", None), ("stare", GATE_OFF)):
        leaf = batch.logprob.clone().requires_grad_(True)
        inputs = PolicyLossInputs(leaf, batch.old_logprob, batch.advantages, batch.response_mask)
        loss, _ = compute_policy_loss(name, inputs, make_loss_params(name), control=control)
        loss.backward()
        assert leaf.grad is not None
        results.append((loss.detach(), leaf.grad))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def check_selection_paths_agree(batch: Batch) -> None:
    """Sanity: on this batch, the bounded top-k selection STARE uses picks exactly the tokens that the
    full stable argsort (top_k_mask without max_k) picks, for T⁺ and T⁻ at P = 0.1."""
    surprisal = -batch.logprob
    adv = broadcast_advantages(batch.advantages, surprisal)
    active = batch.response_mask.bool()
    for cand in (active & (adv > 0), active & (adv < 0)):
        k = ceil_count(cand.sum(), 0.1).clamp(min=1)
        fast = top_k_mask(surprisal, cand, k, max_k=ceil_count_bound(cand.numel(), 0.1))
        assert torch.equal(fast, top_k_mask(surprisal, cand, k)), "bounded top-k differs from the argsort"


def kernel_seconds_per_token(s: Settings) -> float:
    """Chunked log-prob + entropy + C forward and log-prob backward, bf16 logits, per scored token."""
    gen = torch.Generator().manual_seed(s.seed + 1)
    logits = (torch.randn((s.kernel_rows, s.vocab), generator=gen) * 3.0).to(torch.bfloat16)
    logits.requires_grad_(True)
    targets = torch.randint(0, s.vocab, (s.kernel_rows,), generator=gen)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        stats = token_stats_from_logits(logits, targets)
        stats.logprob.sum().backward()
        logits.grad = None
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) / s.kernel_rows


def run(s: Settings) -> dict[str, Any]:
    batch = make_batch(s)
    check_stare_matches_grpo_ds_when_neutral(batch)
    check_selection_paths_agree(batch)
    params = {label: make_loss_params(name, **over) for label, (name, over, _) in VARIANTS.items()}
    times: dict[str, list[float]] = {label: [] for label in VARIANTS}
    for i in range(s.warmup + s.repeats):
        for label, (name, _, control) in VARIANTS.items():
            elapsed = one_call(batch, name, params[label], control)
            if i >= s.warmup:
                times[label].append(elapsed)
    base = statistics.median(times["grpo_ds"])
    active_tokens = int(batch.response_mask.sum())
    kernel_step_s = kernel_seconds_per_token(s) * active_tokens if s.kernel_rows > 0 else None
    rows = []
    for label, values in times.items():
        median = statistics.median(values)
        extra = median - base
        rows.append(
            {
                "loss": label,
                "median_ms": median * 1e3,
                "min_ms": min(values) * 1e3,
                "extra_ms": extra * 1e3,
                "overhead": extra / base,
                "overhead_of_min": min(values) / min(times["grpo_ds"]) - 1.0,
                "extra_share_of_kernel_step": None if kernel_step_s is None else extra / kernel_step_s,
                "target_met": None if label == "grpo_ds" else extra / base <= OVERHEAD_TARGET,
            }
        )
    return {
        "batch": {
            "responses": s.prompts * s.samples,
            "response_tokens": s.response_tokens,
            "positions": batch.response_mask.numel(),
            "active_tokens": active_tokens,
        },
        "kernel_forward_backward_s_for_batch": kernel_step_s,
        "rows": rows,
        "times_s": times,
    }


def markdown_table(result: dict[str, Any]) -> str:
    lines = [
        "| loss | median (ms) | min (ms) | extra over grpo_ds (ms, median) | overhead (median) | overhead (min) "
        "| extra / log-prob kernel step | ≤ 3 % |",
        "|---|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for row in result["rows"]:
        share = row["extra_share_of_kernel_step"]
        met = "n/a" if row["target_met"] is None else ("yes" if row["target_met"] else "**no**")
        lines.append(
            f"| {row['loss']} | {row['median_ms']:.1f} | {row['min_ms']:.1f} | {row['extra_ms']:.1f} "
            f"| {row['overhead'] * 100:.1f} % | {row['overhead_of_min'] * 100:.1f} % "
            f"| {'n/a' if share is None else f'{share * 100:.3f} %'} | {met} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=None, help="prompts per batch (default 64; quick 8)")
    parser.add_argument("--samples", type=int, default=8, help="responses per prompt")
    parser.add_argument("--response-tokens", type=int, default=None, help="T (default 1024; quick 256)")
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed calls per loss (default 100; quick 5)"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per loss first")
    parser.add_argument(
        "--kernel-rows",
        type=int,
        default=None,
        help="rows of the kernel reference slice (0: skip; default 256)",
    )
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary of the kernel reference")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run of a few seconds")
    parser.add_argument("--smoke", action="store_true", help=_common.SMOKE_HELP + " (--quick, one call)")
    parser.add_argument(
        "--json", default=str(_common.ROOT / "bench" / "results" / "stare_overhead.json"), help="output path"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _common.apply_smoke(args, quick=True, repeats=1, warmup=0)
    if args.threads:
        torch.set_num_threads(args.threads)
    quick = args.quick
    s = Settings(
        prompts=args.prompts or (8 if quick else 64),
        samples=args.samples,
        response_tokens=args.response_tokens or (256 if quick else 1024),
        repeats=args.repeats or (5 if quick else 100),
        warmup=args.warmup,
        kernel_rows=args.kernel_rows if args.kernel_rows is not None else (64 if quick else 256),
        vocab=args.vocab if not quick else min(args.vocab, 32768),
    )
    load_before = os.getloadavg()
    started = time.perf_counter()
    print(
        f"bench_stare_overhead: {s.prompts} prompts × {s.samples} samples × {s.response_tokens} tokens, "
        f"{s.repeats} calls per loss; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load average {load_before[0]:.1f}",
        flush=True,
    )
    result = run(s)
    elapsed = time.perf_counter() - started
    table = markdown_table(result)
    print()
    print(table)
    kernel = result["kernel_forward_backward_s_for_batch"]
    if kernel is not None:
        print(
            f"\nactive tokens {result['batch']['active_tokens']:,}; chunked log-prob kernel forward+backward "
            f"for them ≈ {kernel:.0f} s on this machine (V={s.vocab:,}, scaled from {s.kernel_rows} rows)"
        )
    print(f"wall time {elapsed:.0f} s")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "stare_overhead",
                "settings": asdict(s),
                "machine": {
                    **_common.machine(),
                    "load_average_before": load_before,
                    "load_average_after": os.getloadavg(),
                },
                "target_overhead_max": OVERHEAD_TARGET,
                **result,
                "markdown": table,
                "wall_time_s": elapsed,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
