"""Keep freed memory in the process on CPU, the way torch's CUDA caching allocator does on a GPU.

A CPU training step frees and re-allocates the same activation buffers every step. glibc's malloc serves
blocks above its dynamic mmap threshold with fresh mappings and hands freed heap above 128 KiB back to the
kernel, so every step faults the same pages in again (the counts and their kernel time on tiny-arith
are in docs/BENCHMARKS.md, engine, second and third rounds). Raising the thresholds once at start keeps
blocks up to 32 MiB (the largest threshold glibc documents for 64-bit) in the heap and keeps up to 512 MiB
of freed heap for the next step; larger blocks (a big model's logits) are still mapped and unmapped as
before, so the RSS grows by at most the retained free heap.

glibc only (other C libraries have no mallopt, or other parameters); STARE_HEAP_TUNING=0 turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

ENV = "STARE_HEAP_TUNING"

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20  # blocks up to this size come from the heap
TRIM_THRESHOLD = 512 << 20  # free heap kept before any is returned to the kernel
TOP_PAD = 64 << 20  # extra heap taken per growth, so growing steps do not fault page by page

_applied: bool | None = None


def keep_freed_heap() -> bool:
    """Sets the thresholds once per process; returns whether they are in force."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get(ENV, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
        if not hasattr(libc, "gnu_get_libc_version"):  # musl and others: not glibc's mallopt
            return False
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _applied = all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (_M_TOP_PAD, TOP_PAD),
        )
    )
    return _applied
