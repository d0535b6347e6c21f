"""The machine a figure came from: CPU model, vector extensions, cores, torch's threads (no torch import)."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Any

# The extensions that decide which float kernels torch picks on x86-64.
VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_tile")


@functools.cache
def cpu_info() -> dict[str, Any]:
    model: str = platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and value.strip():
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return {
        "model": model,
        "vector_extensions": [f for f in VECTOR_FLAGS if f in flags],
        "logical_cpus": os.cpu_count(),
        "machine": platform.machine(),
    }


def cpu_label(info: dict[str, Any] | None = None) -> str:
    info = info or cpu_info()
    ext = info.get("vector_extensions") or []
    widest = "AVX-512" if "avx512f" in ext else ("AVX2" if "avx2" in ext else "no AVX2")
    return f"{info.get('model', '?')} ({widest}; {info.get('logical_cpus', '?')} logical CPUs)"
