"""The measuring tools of bench_gpu.py's sections: a timer (CUDA events on a GPU, wall clock on a CPU), the
working memory of one call (GPU), a log line and releasing cached memory between runs."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

GIB = 1024**3
H200_DENSE_BF16_TFLOPS = 989.0  # vendor datasheet, dense (no sparsity)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Timer:
    """Median seconds of `repeats` calls after `warmup` calls: CUDA events on a GPU, wall clock on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn: Callable[[], Any], repeats: int, warmup: int = 1) -> tuple[float, list[float]]:
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(repeats):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1000.0)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times), times


def working_memory(device: torch.device, fn: Callable[[], Any]) -> float | None:
    """Peak bytes allocated during one call of fn above what was allocated before it (GPU only)."""
    if device.type != "cuda":
        fn()
        return None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return float(torch.cuda.max_memory_allocated() - base)


def release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
