"""The engine's heap setting (trainer/run/heap.py): freed blocks stay in the process, so re-allocating them
every step faults no pages in. Each case runs in a fresh interpreter: the setting is per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, resource
import torch
from trainer.run import heap
from trainer.models import build_tiny_arith
torch.set_num_threads(1)
applied = heap.keep_freed_heap()
model, _ = build_tiny_arith(seed=0)
ids = torch.randint(0, model.config.vocab_size, (64, 24), generator=torch.Generator().manual_seed(0))
faults = []
for _ in range(10):  # a training step's allocations, repeated: the activations of a forward and backward
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model(input_ids=ids).logits.square().mean().backward()
    model.zero_grad(set_to_none=True)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "again": heap.keep_freed_heap(), "faults": faults[4:]}))
"""


def probe(env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_without_page_faults():
    tuned = probe({"STARE_HEAP_TUNING": "1"})
    assert tuned["applied"] is True and tuned["again"] is True
    default = probe({"STARE_HEAP_TUNING": "0"})
    assert default["applied"] is False
    # glibc's defaults hand freed activations back to the kernel and fault them in again every step
    # (thousands of pages); kept in the heap, they are reused (0-1 faults in most steps once the heap has grown; a few hundred while it still grows).
    assert sum(default["faults"]) > 5000
    assert sum(tuned["faults"]) * 5 < sum(default["faults"])
    assert sorted(tuned["faults"])[len(tuned["faults"]) // 2] < 200
