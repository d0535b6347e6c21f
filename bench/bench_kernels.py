"""Peak memory and time of per-token log-prob + entropy + C(p): chunked kernels against the naive
full-tensor computation (ALGORITHMS.md §2; issue 2).

Rows (each variant runs in a fresh subprocess, one at a time):
- forward, logits in: `token_stats_from_logits` (log-prob, entropy, C) against `naive_token_stats`,
  fp32 and bf16 logits. This is the primary row; the targets are judged on it.
- forward + backward of the log-prob: the same forward with the logits requiring grad, then backward of
  Σ g·log p_a (g random); entropy and C carry no gradient in either version.
- forward + backward with the gradient in the logits: the same, with `grad_in_logits=True` (backward
  writes the gradient over the logits instead of allocating it), against the same naive case. The
  logits hold the gradient after each call, so they are refilled (untimed) before every call.
- chunk-size sweep of the chunked forward at bf16.

The naive baseline is not `token_stats_reference`: that one builds p·p·(−log p − H) with several
(N, V) temporaries and needs ~30 GB at fp32 for 8,192 × 151,936. `naive_token_stats` is the same
full-tensor computation with the temporaries kept to one: full log_softmax (fp32), full exp, one full
product for H, one full (−log p − H) for C multiplied into p² in place, row sums; no chunking. Its
results equal the reference (checked before timing, on a small case).

Memory is the process's resident set: the inputs are built and touched first, then the kernel's peak-RSS
high-water mark is reset (/proc/self/clear_refs) and the RSS read as the baseline; after the calls the
high-water mark (VmHWM) is the total peak, and the peak minus the baseline is the working memory above the
inputs. (getrusage's ru_maxrss is the same per-process mark, but after fork + exec it keeps the parent's
RSS as a floor, so VmHWM is read directly.) The ratio target is judged on the working memory: the inputs
are the same for both versions and only dilute the ratio; the total peak is reported beside it.

Time: the median of --repeats full-size calls (chunked; default 3) or --naive-repeats calls (naive;
default 1: one naive call takes 40–75 s on the 2-core machine, and `make bench` has to stay near 10
minutes; the naive version is 3–8× slower, far outside the noise), after one warm-up call on the first
1,024 rows (first-call costs only; neither version keeps state between calls). glibc serves blocks this
large with mmap and unmaps them on free, so every naive call faults its (N, V) temporaries in afresh
(about 1 GB/s in this VM), while the chunked kernel reuses one set of chunk buffers per call. That is
the real cost of each version on a CPU host; `--warm-allocator` keeps freed memory in the heap instead
(as a GPU caching allocator would) and times the arithmetic alone, but then heap fragmentation inflates
the peak RSS, so read its memory columns as upper bounds, and use fewer --tokens (the bf16 naive case
was killed for memory at 8,192 tokens).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import _common
import psutil
import torch
from torch import Tensor
from torch.testing import assert_close

from trainer.algos.kernels import (
    DEFAULT_CHUNK_ROWS,
    token_stats_from_logits,
    token_stats_reference,
)

GIB = 1024**3
MEMORY_RATIO_TARGET = 0.3  # chunked working memory ≤ 0.3 × naive
TIME_RATIO_TARGET = 1.1  # chunked time ≤ 1.1 × naive
INPUT_BLOCK_ROWS = 256
# glibc serves blocks this large with mmap and unmaps them on free, so every call faults its temporaries
# in afresh (slow in this VM: ~1 GB/s). With these settings freed memory stays in the heap and is reused,
# as a GPU caching allocator would reuse it: the "warm allocator" measurement of compute alone.
WARM_ALLOCATOR_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 50)}
COLD_ALLOCATOR_UNSET = (
    "MALLOC_MMAP_MAX_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "GLIBC_TUNABLES",
)


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


# ------------------------------------------------------------------------------------------ the driver


def estimate_peak_bytes(case: Case) -> int:
    """A generous estimate of the case's total RSS, used to wait for free memory before starting it."""
    itemsize = torch.empty((), dtype=getattr(torch, case.dtype)).element_size()
    nv = case.tokens * case.vocab
    inputs = nv * itemsize
    backward = case.mode == "forward+backward"
    if case.impl == "chunked":
        rows = min(case.chunk_rows, case.tokens)
        work = 3 * rows * case.vocab * 4
        # The logits' gradient, unless it is written over the logits.
        work += nv * itemsize if backward and not case.grad_in_logits else 0
    else:
        # Forward: log p, p and one product (fp32). Backward: log p (saved), its incoming gradient and the
        # logits' fp32 gradient, plus the cast to bf16 for bf16 logits.
        work = 3 * nv * 4
        work += nv * itemsize if backward and itemsize != 4 else 0
    return inputs + work + GIB // 2  # + interpreter and torch


def wait_for_memory(need: int, margin: int, max_wait_s: float) -> tuple[bool, int]:
    waited = 0.0
    while True:
        available = psutil.virtual_memory().available
        if available >= need + margin:
            return True, available
        if waited >= max_wait_s:
            return False, available
        print(
            f"  waiting for memory: {available / GIB:.1f} GiB available, "
            f"{(need + margin) / GIB:.1f} GiB wanted",
            flush=True,
        )
        time.sleep(15)
        waited += 15


def run_in_subprocess(
    case: Case, margin: int, max_wait_s: float, timeout_s: float, warm_allocator: bool, attempts: int = 2
) -> dict[str, Any]:
    """Runs the case in a fresh interpreter once enough memory is free. A case killed by SIGKILL (the
    kernel's OOM killer: other processes on the machine grew while it ran) is retried once."""
    need = estimate_peak_bytes(case)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_common.ROOT), env.get("PYTHONPATH", "")) if p)
    if warm_allocator:
        env.update(WARM_ALLOCATOR_ENV)
    else:
        for name in COLD_ALLOCATOR_UNSET:
            env.pop(name, None)
    record: dict[str, Any] = {"case": asdict(case), "estimated_peak_bytes": need, "killed_attempts": 0}
    for attempt in range(attempts):
        ok, available = wait_for_memory(need, margin, max_wait_s)
        record["available_at_start_bytes"] = available
        if not ok:
            record["error"] = (
                f"skipped: {available / GIB:.1f} GiB available, {(need + margin) / GIB:.1f} GiB wanted"
            )
            return record
        load_before = os.getloadavg()[0]
        try:
            proc = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(asdict(case))],
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            record["error"] = f"timed out after {timeout_s:.0f} s"
            return record
        if proc.returncode == -9 and attempt + 1 < attempts:
            record["killed_attempts"] += 1
            print("  killed (out of memory?); retrying once", flush=True)
            continue
        if proc.returncode != 0:
            killed = " (killed: out of memory?)" if proc.returncode < 0 else ""
            record["error"] = f"exit {proc.returncode}{killed}: {proc.stderr.strip()[-2000:]}"
            return record
        record.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        record["load_average_1min"] = [load_before, os.getloadavg()[0]]
        return record
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Settings:
    tokens: int
    vocab: int
    chunk_rows: int
    sweep: tuple[int, ...]
    repeats: int
    naive_repeats: int
    sweep_repeats: int
    backward: bool = True
    sweep_on: bool = True
    only_rows: str = ""  # a regular expression: only the rows whose name it matches (re.search)


def plan(s: Settings) -> list[tuple[str, Case, Case | None]]:
    """(group, chunked case, naive case or None) in run order."""
    rows: list[tuple[str, Case, Case | None]] = []
    warmup = min(1024, s.tokens)
    for mode in ("forward", "forward+backward") if s.backward else ("forward",):
        for dtype in ("float32", "bfloat16"):
            common = Case(
                name=f"{mode}, {dtype} logits",
                source="logits",
                impl="chunked",
                mode=mode,
                dtype=dtype,
                tokens=s.tokens,
                vocab=s.vocab,
                chunk_rows=s.chunk_rows,
                repeats=s.repeats,
                warmup_rows=warmup,
            )
            naive = replace(common, impl="naive", repeats=s.naive_repeats)
            rows.append(("main", common, naive))
            if mode == "forward+backward":
                # The same naive case (run once when both rows are planned).
                in_logits = replace(
                    common, name=f"{common.name}, gradient in the logits", grad_in_logits=True
                )
                rows.append(("main", in_logits, naive))
    if s.sweep_on and s.sweep:
        sweep = Case(
            name="chunk-size sweep",
            source="logits",
            impl="chunked",
            mode="forward",
            dtype="bfloat16",
            tokens=s.tokens,
            vocab=s.vocab,
            chunk_rows=max(s.sweep),  # for the memory estimate
            repeats=s.sweep_repeats,
            warmup_rows=warmup,
            sweep_chunks=tuple(s.sweep),
        )
        rows.append(("sweep", sweep, None))
    if s.only_rows:
        rows = [row for row in rows if re.search(s.only_rows, row[1].name)]
    return rows


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / GIB:.2f}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def summarise(group: str, chunked: dict[str, Any], naive: dict[str, Any] | None) -> dict[str, Any]:
    def get(record: dict[str, Any] | None, key: str) -> float | None:
        return None if record is None or "error" in record else record.get(key)

    if group == "sweep":
        return {"group": group, "name": chunked["case"]["name"], "chunked": chunked, "naive": None}
    row = {
        "group": group,
        "name": chunked["case"]["name"],
        "tokens": chunked["case"]["tokens"],
        "chunk_rows": chunked["case"]["chunk_rows"],
        "chunked": chunked,
        "naive": naive,
        "time_ratio": _ratio(get(chunked, "median_s"), get(naive, "median_s")),
        "working_memory_ratio": _ratio(get(chunked, "working_bytes"), get(naive, "working_bytes")),
        "total_peak_ratio": _ratio(get(chunked, "peak_rss_bytes"), get(naive, "peak_rss_bytes")),
    }
    case = chunked["case"]
    if case["mode"] == "forward+backward" and not case.get("grad_in_logits"):
        # Both versions must return the logits' gradient, (N, V) in the logits' dtype; what each needs
        # beyond that output is the kernel's own cost. (With grad_in_logits the chunked version returns
        # it in the logits' memory: no such row.)
        itemsize = torch.empty((), dtype=getattr(torch, case["dtype"])).element_size()
        grad = case["tokens"] * case["vocab"] * itemsize
        c_work, n_work = get(chunked, "working_bytes"), get(naive, "working_bytes")
        row["gradient_bytes"] = grad
        row["working_beyond_gradient_ratio"] = _ratio(
            None if c_work is None else c_work - grad, None if n_work is None else n_work - grad
        )
    row["time_target_met"] = None if row["time_ratio"] is None else row["time_ratio"] <= TIME_RATIO_TARGET
    row["memory_target_met"] = (
        None if row["working_memory_ratio"] is None else row["working_memory_ratio"] <= MEMORY_RATIO_TARGET
    )
    return row


def _yes_no(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "**no**")


def markdown_tables(rows: list[dict[str, Any]], naive_bf16_forward: dict[str, Any] | None) -> str:
    def sec(record: dict[str, Any] | None, key: str = "median_s") -> str:
        if record is None:
            return "n/a"
        if "error" in record:
            return "skipped" if record["error"].startswith("skipped") else "failed"
        calls = f" ({len(record['times_s'])})" if key == "median_s" else ""
        return f"{record[key]:.2f}{calls}"

    def mem(record: dict[str, Any] | None, key: str) -> str:
        return "n/a" if record is None or "error" in record else _gib(record[key])

    lines = [
        "| row | tokens | chunk rows | time chunked / naive (s, median (calls)) | time ratio | working mem "
        "chunked / naive (GiB) | working ratio | total peak RSS chunked / naive (GiB) | total ratio "
        "| time ≤ 1.1× | working mem ≤ 0.3× |",
        "|---|---:|---:|---|---:|---|---:|---|---:|:---:|:---:|",
    ]
    for row in rows:
        if row["group"] == "sweep":
            continue
        c, n = row["chunked"], row["naive"]
        lines.append(
            f"| {row['name']} | {row['tokens']:,} | {row['chunk_rows']} | {sec(c)} / {sec(n)} "
            f"| {_fmt_ratio(row['time_ratio'])} | {mem(c, 'working_bytes')} / {mem(n, 'working_bytes')} "
            f"| {_fmt_ratio(row['working_memory_ratio'])} | {mem(c, 'peak_rss_bytes')} / "
            f"{mem(n, 'peak_rss_bytes')} | {_fmt_ratio(row['total_peak_ratio'])} "
            f"| {_yes_no(row['time_target_met'])} | {_yes_no(row['memory_target_met'])} |"
        )
    backward_rows = [r for r in rows if "working_beyond_gradient_ratio" in r]
    if backward_rows:
        lines += [
            "",
            "Forward+backward rows, working memory beyond the logits' gradient (an output both return):",
            "",
        ]
        for row in backward_rows:
            c, n, grad = row["chunked"], row["naive"], row["gradient_bytes"]
            beyond = ["n/a" if r is None or "error" in r else _gib(r["working_bytes"] - grad) for r in (c, n)]
            lines.append(
                f"- {row['name']}: gradient {_gib(grad)} GiB; beyond it chunked {beyond[0]} GiB, naive "
                f"{beyond[1]} GiB (ratio {_fmt_ratio(row['working_beyond_gradient_ratio'])})"
            )
    sweep = next((r["chunked"] for r in rows if r["group"] == "sweep"), None)
    if sweep is not None:
        lines += [
            "",
            "Chunk-size sweep (chunked forward, bf16 logits, all sizes interleaved in one process):",
            "",
        ]
        if "error" in sweep:
            lines.append(f"failed: {sweep['error'][:200]}")
            return "\n".join(lines)
        naive = None if naive_bf16_forward is None or "error" in naive_bf16_forward else naive_bf16_forward
        entries = sweep["sweep"]
        fastest = min(e["median_s"] for e in entries)
        lines += [
            "| chunk rows | time (s, median (calls)) | time (s, min) | time / fastest size | time / naive bf16 "
            "forward | working mem (GiB) | working / naive bf16 forward |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for e in entries:
            time_ratio = _ratio(e["median_s"], None if naive is None else naive["median_s"])
            mem_ratio = _ratio(e["working_bytes"], None if naive is None else naive["working_bytes"])
            lines.append(
                f"| {e['chunk_rows']} | {e['median_s']:.2f} ({len(e['times_s'])}) | {e['min_s']:.2f} "
                f"| {e['median_s'] / fastest:.3f} | {_fmt_ratio(time_ratio)} | {_gib(e['working_bytes'])} "
                f"| {_fmt_ratio(mem_ratio)} |"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=None, help="scored rows N (default 8192; quick 512)")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary V (default 151936; quick 32768)")
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS, help="chunk of the main rows")
    parser.add_argument(
        "--sweep", default=None, help="comma-separated chunk rows (default 256,512,1024,2048)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per chunked case (default 3)")
    parser.add_argument(
        "--naive-repeats", type=int, default=None, help="timed calls per naive case (default 1; quick 3)"
    )
    parser.add_argument(
        "--sweep-repeats", type=int, default=None, help="sweep rounds, one call per size each (default 2)"
    )
    parser.add_argument("--no-backward", action="store_true", help="skip the forward+backward rows")
    parser.add_argument("--no-sweep", action="store_true", help="skip the chunk-size sweep")
    parser.add_argument(
        "--only-rows",
        default="",
        metavar="REGEX",
        help="run only the rows whose name matches (re.search), e.g. 'gradient in the logits'",
    )
    parser.add_argument(
        "--warm-allocator",
        action="store_true",
        help="keep freed memory in glibc's heap (time of the arithmetic alone; peak RSS then an upper bound)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run of a few seconds")
    parser.add_argument(
        "--smoke", action="store_true", help=_common.SMOKE_HELP + " (N 128, V 4096, float32 rows, no sweep)"
    )
    parser.add_argument(
        "--json", default=str(_common.ROOT / "bench" / "results" / "kernels.json"), help="output path"
    )
    parser.add_argument(
        "--margin-gib", type=float, default=1.5, help="free memory wanted beyond a case's estimated peak"
    )
    parser.add_argument(
        "--max-wait-s", type=float, default=180.0, help="skip a case after waiting this long for memory"
    )
    parser.add_argument("--case-timeout-s", type=float, default=900.0, help="kill a case after this")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    quick = args.quick
    sweep = args.sweep or ("64,128,256,512" if quick else "256,512,1024,2048")
    return Settings(
        tokens=args.tokens or (512 if quick else 8192),
        vocab=args.vocab or (32768 if quick else 151936),
        chunk_rows=args.chunk_rows if not (quick and args.chunk_rows == DEFAULT_CHUNK_ROWS) else 128,
        sweep=tuple(int(v) for v in sweep.split(",") if v.strip()),
        repeats=args.repeats or 3,
        naive_repeats=args.naive_repeats or (3 if quick else 1),
        sweep_repeats=args.sweep_repeats or (3 if quick else 2),
        # With freed memory kept in glibc's heap, fragmentation grows the naive backward without bound
        # (killed for memory at 4,096 tokens): the warm allocator times forward rows only.
        backward=not (args.no_backward or args.warm_allocator),
        sweep_on=not args.no_sweep,
        only_rows=args.only_rows,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _common.apply_smoke(
        args,
        quick=True,
        no_sweep=True,
        tokens=128,
        vocab=4096,
        repeats=1,
        naive_repeats=1,
        only_rows="float32",
    )
    if args.worker is not None:
        worker_case = Case(**json.loads(args.worker))
        print(json.dumps(run_sweep_case(worker_case) if worker_case.sweep_chunks else run_case(worker_case)))
        return 0
    s = settings_from(args)
    started = time.perf_counter()
    info = _common.machine()
    print(
        f"bench_kernels: N={s.tokens:,} V={s.vocab:,} chunk_rows={s.chunk_rows} repeats={s.repeats}/"
        f"{s.naive_repeats} (chunked/naive){', warm allocator' if args.warm_allocator else ''}; "
        f"torch {info['torch']}, {info['cpu_count']} CPUs, {info['memory_total_bytes'] / GIB:.1f} GiB RAM, "
        f"{psutil.virtual_memory().available / GIB:.1f} GiB available",
        flush=True,
    )
    correctness = check_correctness(min(s.vocab, 32768))
    print(f"correctness vs token_stats_reference: ok {correctness}", flush=True)
    margin = int(args.margin_gib * GIB)
    rows = []
    done: dict[Case, dict[str, Any]] = {}  # a naive case shared by two rows runs once
    for group, chunked_case, naive_case in plan(s):
        results: list[dict[str, Any] | None] = []
        for case in (chunked_case, naive_case):
            if case is None:
                results.append(None)
                continue
            if case in done:
                print(f"- {case.name} [{case.impl}]: measured above", flush=True)
                results.append(done[case])
                continue
            print(
                f"- {case.name} [{case.impl}, chunk_rows={case.chunk_rows}, N={case.tokens:,}] ...",
                flush=True,
            )
            record = run_in_subprocess(
                case, margin, args.max_wait_s, args.case_timeout_s, args.warm_allocator
            )
            if "error" in record:
                print(f"  {record['error']}", flush=True)
            elif "sweep" in record:
                for e in record["sweep"]:
                    print(
                        f"  chunk_rows={e['chunk_rows']}: median {e['median_s']:.2f} s, "
                        f"working {e['working_bytes'] / GIB:.2f} GiB",
                        flush=True,
                    )
            else:
                print(
                    f"  median {record['median_s']:.2f} s, working {record['working_bytes'] / GIB:.2f} GiB, "
                    f"peak RSS {record['peak_rss_bytes'] / GIB:.2f} GiB",
                    flush=True,
                )
            results.append(record)
            done[case] = record
        assert results[0] is not None
        rows.append(summarise(group, results[0], results[1]))
    naive_bf16 = next(
        (r["naive"] for r in rows if r["group"] == "main" and r["name"] == "forward, bfloat16 logits"), None
    )
    table = markdown_tables(rows, naive_bf16)
    elapsed = time.perf_counter() - started
    print()
    print(table)
    print(f"\nwall time {elapsed:.0f} s")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "kernels",
                "settings": asdict(s),
                "allocator": "warm (freed memory kept in the heap)"
                if args.warm_allocator
                else "glibc defaults",
                "machine": info,
                "targets": {
                    "working_memory_ratio_max": MEMORY_RATIO_TARGET,
                    "time_ratio_max": TIME_RATIO_TARGET,
                },
                "correctness": correctness,
                "rows": rows,
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
