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
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import _common
import psutil
import torch
from kernels_measure import Case, check_correctness, run_case, run_sweep_case
from kernels_report import GIB, MEMORY_RATIO_TARGET, TIME_RATIO_TARGET, markdown_tables, summarise

from trainer.algos.kernels import DEFAULT_CHUNK_ROWS

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


def _print_record(record: dict[str, Any]) -> None:
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


def measure_rows(s: Settings, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every planned row, each case in its own subprocess, in run order: the rows of the table."""
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
            _print_record(record)
            results.append(record)
            done[case] = record
        assert results[0] is not None
        rows.append(summarise(group, results[0], results[1]))
    return rows


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
    rows = measure_rows(s, args)
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
