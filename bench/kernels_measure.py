"""The measured side of bench_kernels.py: a case (one variant), the naive baseline `naive_token_stats` and the
correctness check of both versions against `token_stats_reference`, and the worker that runs one case in
its own interpreter (`bench_kernels.py --worker CASE`) and reads its time and peak RSS."""

from __future__ import annotations

import gc
import resource
import statistics
import time
from dataclasses import dataclass
from typing import Any

import psutil
import torch
from torch import Tensor
from torch.testing import assert_close

from trainer.algos.kernels import token_stats_from_logits, token_stats_reference

INPUT_BLOCK_ROWS = 256


@dataclass(frozen=True)
class Case:
    """One measured variant; runs in its own subprocess."""

    name: str  # row label
    source: str  # "logits"
    impl: str  # "chunked" | "naive"
    mode: str  # "forward" | "forward+backward"
    dtype: str  # "float32" | "bfloat16"
    tokens: int
    vocab: int
    chunk_rows: int
    repeats: int = 3
    warmup_rows: int = 1024
    temperature: float = 1.0
    seed: int = 0
    sweep_chunks: tuple[int, ...] = ()  # non-empty: the chunk-size sweep, interleaved in one process
    grad_in_logits: bool = False  # chunked forward+backward: the gradient written over the logits


# ------------------------------------------------------------------------------------------ the math


def naive_token_stats(
    logits: Tensor, targets: Tensor, temperature: float = 1.0
) -> tuple[Tensor, Tensor, Tensor]:
    """Full-tensor log-prob (differentiable), entropy and C, with one (N, V) temporary at a time.

    Peak working memory: three fp32 (N, V) tensors (log p, p, one product); bf16 logits add a transient
    fp32 copy that is freed before p exists.
    """
    z = logits.float()  # (N, V); fp32 logits: the same tensor, no copy
    if temperature != 1.0:
        z = z / temperature
    logp = torch.log_softmax(z, dim=-1)  # (N, V) fp32; autograd saves it when the logits need grad
    del z
    logprob = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (N,)
    with torch.no_grad():
        p = logp.exp()  # (N, V)
        entropy = -(p * logp).sum(-1)  # one (N, V) temporary
        deviation = torch.neg(logp).sub_(entropy.unsqueeze(-1))  # (N, V): −log p − H
        correction = p.mul_(p).mul_(deviation).sum(-1)  # p² in place of p
        del p, deviation
    return logprob, entropy, correction


def check_correctness(vocab: int) -> dict[str, Any]:
    """Both measured versions against `token_stats_reference` on 96 rows (values, and the log-prob's
    gradient). Raises on a mismatch, so a benchmark of wrong code never prints a table."""
    gen = torch.Generator().manual_seed(7)
    rows = 96
    report: dict[str, Any] = {}
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn((rows, vocab), generator=gen) * 3.0).to(dtype).requires_grad_(True)
        targets = torch.randint(0, vocab, (rows,), generator=gen)
        upstream = torch.randn(rows, generator=gen)
        ref = token_stats_reference(logits, targets)
        (ref_grad,) = torch.autograd.grad((ref.logprob * upstream).sum(), logits)
        chunked = token_stats_from_logits(logits, targets, chunk_rows=40)
        (chunked_grad,) = torch.autograd.grad((chunked.logprob * upstream).sum(), logits)
        in_logits = logits.detach().clone().requires_grad_(True)
        chunked_in = token_stats_from_logits(in_logits, targets, chunk_rows=40, grad_in_logits=True)
        (grad_in_logits,) = torch.autograd.grad((chunked_in.logprob * upstream).sum(), in_logits)
        # Backward wrote the gradient over the logits: the same values as the default path's, bit for bit.
        assert grad_in_logits.data_ptr() == in_logits.data_ptr()
        assert torch.equal(grad_in_logits, chunked_grad)
        naive = naive_token_stats(logits, targets)
        (naive_grad,) = torch.autograd.grad((naive[0] * upstream).sum(), logits)
        assert ref.entropy is not None and ref.correction is not None
        assert chunked.entropy is not None and chunked.correction is not None
        expected = (ref.logprob, ref.entropy, ref.correction)
        got_chunked = (chunked.logprob, chunked.entropy, chunked.correction)
        for got in (got_chunked, naive):
            for value, want in zip(got, expected, strict=True):
                assert_close(value, want, atol=1e-5, rtol=1e-5)
        if dtype == torch.float32:
            assert_close(chunked_grad, ref_grad, atol=1e-5, rtol=1e-5)
        else:
            assert_close(chunked_grad, ref_grad)  # both rounded to bf16 from fp32
        assert_close(naive_grad, ref_grad)
        report[str(dtype).removeprefix("torch.")] = {
            "chunked_values_bitwise_equal_reference": all(
                torch.equal(a, b) for a, b in zip(got_chunked, expected, strict=True)
            ),
            "chunked_grad_max_abs_diff": float((chunked_grad.float() - ref_grad.float()).abs().max()),
            "grad_in_logits_bitwise_equal_chunked_grad": True,  # asserted above
        }
    return report


# ------------------------------------------------------------------------------------------ the worker


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Resets the kernel's peak-RSS high-water mark to the current RSS (Linux ≥ 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def _peak_rss(reset_ok: bool) -> int:
    """The process's peak RSS. VmHWM when the reset worked: getrusage's ru_maxrss is the same per-mm mark,
    but it also keeps the parent's RSS at the fork before exec (Linux saves the pre-exec high-water mark
    in the process's signal struct), which would put a floor of the driver's RSS under every peak."""
    if reset_ok:
        return _status_bytes("VmHWM")
    return max(_status_bytes("VmHWM"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _make_logits(tokens: int, vocab: int, dtype: torch.dtype, gen: torch.Generator) -> Tensor:
    """(N, V) logits ~ N(0, 3²): one random 256-row block, each copy cyclically shifted by a random offset
    over the vocabulary. Drawing N·V normals afresh takes ~15 s per case on two cores; the kernels' cost
    does not depend on the values. Every page is written here, before the baseline."""
    return _fill_logits(torch.empty((tokens, vocab), dtype=dtype), gen)


def _fill_logits(logits: Tensor, gen: torch.Generator) -> Tensor:
    """Writes `_make_logits`'s values into the existing (N, V) tensor `logits` (no new (N, V) memory)."""
    tokens, vocab = logits.shape
    block = torch.randn((min(INPUT_BLOCK_ROWS, tokens), vocab), generator=gen) * 3.0
    for start in range(0, tokens, block.shape[0]):
        stop = min(start + block.shape[0], tokens)
        shift = int(torch.randint(vocab, (1,), generator=gen))
        logits[start:stop].copy_(block[: stop - start].roll(shift, dims=-1))
    return logits


def _build(case: Case) -> tuple[Any, Any, Any]:
    """Inputs, a closure `run(rows)` that computes the case on the first `rows` rows, and a closure that
    restores the inputs before a full-size call (None when the calls leave them as they were)."""
    gen = torch.Generator().manual_seed(case.seed)
    dtype = getattr(torch, case.dtype)
    targets = torch.randint(0, case.vocab, (case.tokens,), generator=gen)
    upstream = torch.randn(case.tokens, generator=gen)
    backward = case.mode == "forward+backward"
    t = case.temperature

    if case.source == "logits":
        logits = _make_logits(case.tokens, case.vocab, dtype, gen).requires_grad_(backward)

        def run_logits(rows: int) -> None:
            x = logits
            if rows < case.tokens:
                # Warm-up rows. With backward, a small leaf copy: backward through a view of the full
                # logits would build a full-size gradient.
                x = logits[:rows].detach().clone().requires_grad_(True) if backward else logits[:rows]
            if case.impl == "chunked":
                stats = token_stats_from_logits(
                    x,
                    targets[:rows],
                    temperature=t,
                    chunk_rows=case.chunk_rows,
                    grad_in_logits=case.grad_in_logits,
                )
                logprob = stats.logprob
            else:
                logprob = naive_token_stats(x, targets[:rows], t)[0]
            if backward:
                torch.autograd.backward(logprob, upstream[:rows])
                x.grad = None

        def refill_logits() -> None:
            # grad_in_logits left the previous call's gradient in the logits: fresh values, in place.
            with torch.no_grad():
                _fill_logits(logits, torch.Generator().manual_seed(case.seed + 1))

        refill = refill_logits if case.grad_in_logits and backward else None
        return (logits, targets, upstream), run_logits, refill

    raise ValueError(f"unknown case source {case.source!r}")


def run_sweep_case(case: Case) -> dict[str, Any]:
    """The chunked forward at every chunk size of the sweep, in one process on the same inputs, calls
    interleaved round by round (so load from other processes hits every size alike). Each call's working
    memory is its peak RSS above the RSS just before it (freed blocks go back to the OS between calls)."""
    gen = torch.Generator().manual_seed(case.seed)
    logits = _make_logits(case.tokens, case.vocab, getattr(torch, case.dtype), gen)
    targets = torch.randint(0, case.vocab, (case.tokens,), generator=gen)
    chunks = [int(c) for c in case.sweep_chunks]
    warm = min(case.warmup_rows, case.tokens)
    token_stats_from_logits(logits[:warm], targets[:warm], chunk_rows=min(chunks))
    times: dict[int, list[float]] = {c: [] for c in chunks}
    working: dict[int, int] = dict.fromkeys(chunks, 0)
    reset_ok = True
    for _ in range(case.repeats):
        for chunk in chunks:
            gc.collect()
            reset_ok = _reset_peak_rss() and reset_ok
            before = psutil.Process().memory_info().rss
            start = time.perf_counter()
            token_stats_from_logits(logits, targets, chunk_rows=chunk, temperature=case.temperature)
            times[chunk].append(time.perf_counter() - start)
            working[chunk] = max(working[chunk], _peak_rss(reset_ok) - before)
    return {
        "sweep": [
            {
                "chunk_rows": c,
                "times_s": times[c],
                "median_s": statistics.median(times[c]),
                "min_s": min(times[c]),
                "working_bytes": working[c],
            }
            for c in chunks
        ],
        "peak_reset": reset_ok,
    }


def run_case(case: Case) -> dict[str, Any]:
    torch.manual_seed(case.seed)
    inputs, run, refill = _build(case)
    gc.collect()
    # The baseline is read before the warm-up and the high-water mark reset after it: the warm-up's own
    # peak (a small leaf copy plus its chunk buffers) is not a full-size call's, but anything it leaves
    # resident (library state; with --warm-allocator, the freed blocks the full-size calls reuse) is
    # working memory.
    baseline_rss = psutil.Process().memory_info().rss
    run(min(case.warmup_rows, case.tokens))  # first-call costs (library dispatch, thread pool), small rows
    gc.collect()
    reset_ok = _reset_peak_rss()
    peak_before = _peak_rss(reset_ok)
    times = []
    for _ in range(case.repeats):
        if refill is not None:
            refill()  # untimed; its transient block buffers stay far below the kernel's peak
            gc.collect()
        start = time.perf_counter()
        run(case.tokens)
        times.append(time.perf_counter() - start)
        gc.collect()
    peak = _peak_rss(reset_ok)
    del inputs
    return {
        "times_s": times,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "baseline_rss_bytes": baseline_rss,
        "peak_rss_bytes": peak,
        "working_bytes": peak - baseline_rss,
        "peak_reset": reset_ok,
        # Without the reset (peak_reset false), the mark would include input construction and the
        # warm-up; this is the mark the timed calls start from.
        "peak_after_warmup_bytes": peak_before,
    }
