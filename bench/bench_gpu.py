"""GPU figures for issues 2 and 3, in one short run on a CUDA machine (an H200 here).

Sections, each timed with CUDA events after warm-up calls, each written to the JSON as soon as it ends
(a failing section records its traceback and the next one still runs):

1. `matmul`: the machine's bf16 matrix rate (8192³ products), the ceiling the MFU is also quoted against.
2. `kernels` (issue 2): log-prob + entropy + C(p) for N = 32,768 tokens, V = 151,936, bf16 (and fp32)
   logits: the chunked kernel (`token_stats_from_logits`, several chunk sizes) against the naive
   full-tensor computation (`naive_token_stats` of kernels_measure.py), forward and forward+backward of the
   log-prob.
   Peak memory = torch.cuda.max_memory_allocated during the call minus what was allocated before it (the
   inputs), i.e. the working memory; the logits' gradient counts for both versions.
3. `stare_overhead` (issue 2): the STARE loss (+ weights) against the grpo_ds loss on the same batch
   (64 × 8 × 1,024 positions), forward + backward, as bench_stare_overhead.py runs it on the CPU.
4. `engine` (issue 3): whole optimiser steps of the engine (`Engine.train_step`: HF generate rollout,
   rewards, advantages, update) on a Llama-shaped ~0.5B model with random bf16 weights (Qwen2.5-0.5B's
   shape: d 896, 24 layers, 14 heads / 2 KV heads, MLP 4,864, V 151,936, tied embeddings), every response
   forced to the full length. Reported per step: wall time, generation and update time, tokens/s, and the
   training phase's model FLOP utilisation: executed model FLOPs of the update (forward + backward = 3 ×
   forward; forward = 2 × layer parameters per token + attention scores 4·L·d·context + LM head 2·V·d per
   scored token) over the update time, against the H200's dense bf16 datasheet rate (989 TFLOP/s) and
   against the matmul rate measured in section 1.

    python bench/bench_gpu.py --out results/gpu.json            # ~3 min on an H200
    python bench/bench_gpu.py --quick --out /tmp/gpu.json        # small sizes; runs on a CPU too (no CUDA
                                                                 # events there: wall clock)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common  # puts the repository root on sys.path
import torch
from bench_stare_overhead import VARIANTS, Settings, make_batch
from gpu_engine import section_engine
from gpu_tools import GIB, Timer, log, release, working_memory
from kernels_measure import naive_token_stats

from trainer.algos.kernels import (
    token_stats_from_logits,
    token_stats_reference,
    triton_available,
)
from trainer.algos.losses import PolicyLossInputs, compute_policy_loss, make_loss_params

# ------------------------------------------------------------------------------------------ sections


def section_machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
        "cpu_count": os.cpu_count(),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            gpu_memory_gib=props.total_memory / GIB,
            multiprocessors=props.multi_processor_count,
            cuda=torch.version.cuda,
        )
    return info


def section_matmul(device: torch.device, timer: Timer, size: int) -> dict[str, Any]:
    a = torch.randn((size, size), device=device, dtype=torch.bfloat16)
    b = torch.randn((size, size), device=device, dtype=torch.bfloat16)
    seconds, _ = timer(lambda: a @ b, repeats=10, warmup=3)
    return {"size": size, "seconds": seconds, "tflops": 2 * size**3 / seconds / 1e12}


def _logits(n: int, vocab: int, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn((n, vocab), generator=gen, device=device, dtype=torch.float32) * 3.0).to(dtype)


def _kernel_call(
    kind: str,
    chunk: int | None,
    backward: bool,
    logits: torch.Tensor,
    targets: torch.Tensor,
    grad_out: torch.Tensor,
) -> Callable[[], None]:
    """One measured call: the naive, chunked (torch backend) or fused (Triton) version, with or without
    the backward of Σ g·log p_a."""

    def stats(x: torch.Tensor) -> torch.Tensor:
        if kind == "naive":
            return naive_token_stats(x, targets)[0]
        if kind == "triton":
            return token_stats_from_logits(x, targets, backend="triton").logprob
        assert chunk is not None
        return token_stats_from_logits(x, targets, chunk_rows=chunk, backend="torch").logprob

    def call() -> None:
        if backward:
            leaf = logits.detach().requires_grad_(True)
            (stats(leaf) * grad_out).sum().backward()
        else:
            with torch.no_grad():
                stats(logits)

    return call


def section_kernels(
    device: torch.device, timer: Timer, n: int, vocab: int, chunks: list[int], repeats: int
) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens": n, "vocab": vocab, "rows": []}
    # Correctness first, on 96 rows: both versions against the reference (values and gradient).
    small = _logits(96, vocab, torch.float32, device, 7)
    small_t = torch.randint(0, vocab, (96,), device=device)
    ref = token_stats_reference(small, small_t)
    got = token_stats_from_logits(small, small_t, chunk_rows=40)
    naive = naive_token_stats(small, small_t)
    if triton_available() and device.type == "cuda":
        fused = token_stats_from_logits(small, small_t, backend="triton")
        assert fused.entropy is not None and fused.correction is not None
        out["check_max_abs_diff_triton"] = {
            "logprob": float((fused.logprob - ref.logprob).abs().max()),
            "entropy": float((fused.entropy - ref.entropy).abs().max()),
            "correction": float((fused.correction - ref.correction).abs().max()),
        }
        for name, value in out["check_max_abs_diff_triton"].items():
            if not value < 1e-3:
                raise AssertionError(f"triton {name} differs from the reference by {value}")
    assert ref.entropy is not None and ref.correction is not None
    assert got.entropy is not None and got.correction is not None
    out["check_max_abs_diff"] = {
        "chunked_logprob": float((got.logprob - ref.logprob).abs().max()),
        "chunked_entropy": float((got.entropy - ref.entropy).abs().max()),
        "chunked_correction": float((got.correction - ref.correction).abs().max()),
        "naive_logprob": float((naive[0] - ref.logprob).abs().max()),
        "naive_entropy": float((naive[1] - ref.entropy).abs().max()),
    }
    for name, value in out["check_max_abs_diff"].items():
        if not value < 1e-3:
            raise AssertionError(f"{name} differs from the reference by {value}")
    del small, small_t, ref, got, naive
    release()

    targets = torch.randint(0, vocab, (n,), device=device)
    for dtype in (torch.bfloat16, torch.float32):
        logits = _logits(n, vocab, dtype, device, 11)
        grad_out = torch.randn(n, device=device)
        for backward in (False, True):
            variants: list[tuple[str, int | None]] = [("naive", None)] + [("chunked", c) for c in chunks]
            if triton_available() and device.type == "cuda":
                variants.append(("triton", None))
            for kind, chunk in variants:
                call = _kernel_call(kind, chunk, backward, logits, targets, grad_out)

                row: dict[str, Any] = {
                    "dtype": str(dtype).removeprefix("torch."),
                    "pass": "forward+backward" if backward else "forward",
                    "version": kind,
                    "chunk_rows": chunk,
                }
                try:
                    row["working_bytes"] = working_memory(device, call)
                    row["seconds"], row["all_seconds"] = timer(call, repeats=repeats, warmup=1)
                except torch.OutOfMemoryError as err:
                    row["error"] = f"out of memory: {err}"[:300]
                release()
                out["rows"].append(row)
                log(
                    f"kernels {row['dtype']} {row['pass']} {kind} {chunk}: {row.get('seconds')} s, "
                    f"{(row.get('working_bytes') or 0) / GIB:.2f} GiB"
                )
        del logits, grad_out
        release()
    return out


def section_stare_overhead(device: torch.device, timer: Timer, quick: bool) -> dict[str, Any]:
    s = Settings(
        prompts=8 if quick else 64,
        samples=8,
        response_tokens=128 if quick else 1024,
        repeats=10 if quick else 100,
        warmup=3,
        kernel_rows=0,
        vocab=0,
    )
    cpu = make_batch(s)
    batch = {
        "logprob": cpu.logprob.to(device),
        "old_logprob": cpu.old_logprob.to(device),
        "advantages": cpu.advantages.to(device),
        "response_mask": cpu.response_mask.to(device),
    }
    calls = {}
    for label, (loss_name, overrides, control) in VARIANTS.items():
        params = make_loss_params(loss_name, **overrides)

        def call(loss_name: str = loss_name, params: Any = params, control: Any = control) -> None:
            leaf = batch["logprob"].clone().requires_grad_(True)
            inputs = PolicyLossInputs(
                logprob=leaf,
                old_logprob=batch["old_logprob"],
                advantages=batch["advantages"],
                response_mask=batch["response_mask"],
            )
            loss, _ = compute_policy_loss(loss_name, inputs, params, control=control)
            loss.backward()

        calls[label] = call
    # Interleaved: one call of each variant per round, so drifts hit all alike.
    for call in calls.values():
        timer(call, repeats=1, warmup=s.warmup)
    times: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(s.repeats):
        for label, call in calls.items():
            times[label].append(timer(call, repeats=1, warmup=0)[0])
    base = statistics.median(times["grpo_ds"])
    rows = []
    for label, values in times.items():
        median = statistics.median(values)
        rows.append(
            {
                "loss": label,
                "median_ms": median * 1e3,
                "min_ms": min(values) * 1e3,
                "overhead": median / base - 1.0,
                "overhead_of_min": min(values) / min(times["grpo_ds"]) - 1.0,
            }
        )
    return {
        "positions": s.prompts * s.samples * s.response_tokens,
        "active": float(cpu.response_mask.sum()),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run; CPU works)")
    parser.add_argument("--sections", default="matmul,kernels,stare_overhead,engine")
    parser.add_argument("--algorithms", default="grpo_ds:torch,grpo_ds:triton,stare:triton")
    parser.add_argument("--matmul-size", type=int, default=None, help="square matmul side (8192; quick 1024)")
    parser.add_argument("--smoke", action="store_true", help=_common.SMOKE_HELP)
    args = parser.parse_args(argv)
    # The Triton kernels need a GPU (CPU tests reach them through Triton's interpreter, not this bench): on a
    # machine without one the smoke run's engine section runs STARE on the torch kernels.
    _common.apply_smoke(
        args,
        quick=True,
        matmul_size=256,  # bfloat16 matmuls without AVX-512 BF16 on the CPU: 1024 takes a minute
        algorithms=args.algorithms if torch.cuda.is_available() else "stare:torch",
    )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timer = Timer(device)
    quick = args.quick
    result: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": quick}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        args.out.write_text(json.dumps(result, indent=1, default=str))

    result["machine"] = section_machine(device)
    save()
    sections = args.sections.split(",")
    plan: dict[str, Callable[[], dict[str, Any]]] = {
        "matmul": lambda: section_matmul(device, timer, args.matmul_size or (1024 if quick else 8192)),
        "kernels": lambda: section_kernels(
            device,
            timer,
            n=512 if quick else 32_768,
            vocab=5003 if quick else 151_936,
            chunks=[128, 512] if quick else [512, 4096],
            repeats=2 if quick else 5,
        ),
        "stare_overhead": lambda: section_stare_overhead(device, timer, quick),
        "engine": lambda: section_engine(
            device,
            quick,
            args.algorithms.split(","),
            result.get("matmul", {}).get("tflops"),
        ),
    }
    failed = False
    for name in sections:
        log(f"section {name}")
        t0 = time.perf_counter()
        try:
            result[name] = plan[name]()
        except Exception:  # recorded; the next section still runs
            failed = True
            result[name] = {"error": traceback.format_exc()}
            log(result[name]["error"])
        result.setdefault("section_seconds", {})[name] = time.perf_counter() - t0
        release()
        save()
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
