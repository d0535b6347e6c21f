"""The memory estimate against a real process's peak RSS on SmolLM2-135M (issue 23, "Placement").

contract.fleet.estimate_memory is what POST /v1/jobs/estimate reports as memory per device and what
placement refuses on. tests/trainer/test_fsdp2.py holds it within 25 % of the peak RSS on the tiny model
(where activations dominate); this script checks it where the model state dominates: SmolLM2-135M, one
plain process (ddp × 1), AdamW on `--rows` rows of `--length` random tokens, no padding.

Method (as the tiny model's test): the script relaunches itself with MALLOC_MMAP_THRESHOLD_=65536 (bytes),
so glibc returns every freed block above 64 KiB and RSS follows live memory (docs/DISTRIBUTED.md,
"Memory"); in the child, a tiny model's forward/backward first loads kernels and thread pools, then the
high-water mark is reset and the RSS taken as the baseline; the model is loaded from the converted
safetensors folder (built once beforehand: a first-time GGUF conversion would add its own transient), and
`--steps` steps run. Recorded: the peak RSS minus the baseline, the estimate, and their ratio.

Run (about a minute on 2 cores):
  PYTHONPATH=. .venv/bin/python bench/bench_memory_estimate.py --json bench/results/memory_estimate_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common

MMAP_THRESHOLD = "65536"


def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from contract.catalog import builtin_model_shape
    from contract.fleet import estimate_memory
    from trainer.distributed.memory import model_shape, peak_rss_bytes, reset_peak_rss, rss_bytes
    from trainer.models import build_tiny_arith, load_model_and_tokenizer

    torch.set_num_threads(args.threads)
    warm, _ = build_tiny_arith(seed=3)
    ids = torch.randint(4, 16, (2, 8))
    warm(input_ids=ids, labels=ids).loss.backward()
    del warm
    reset_peak_rss()
    baseline = rss_bytes()
    started = time.perf_counter()
    model, _ = load_model_and_tokenizer(args.model, seed=0)
    shape = model_shape(model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    generator = torch.Generator().manual_seed(0)
    for _ in range(args.steps):
        ids = torch.randint(0, shape.vocab_size, (args.rows, args.length), generator=generator)
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss
    peak = peak_rss_bytes() - baseline
    estimate = estimate_memory(shape, strategy="ddp", processes=1, micro_batch_tokens=args.rows * args.length)
    return {
        "model": args.model,
        "rows": args.rows,
        "length": args.length,
        "steps": args.steps,
        "seconds": time.perf_counter() - started,
        "baseline_rss_bytes": baseline,
        "peak_minus_baseline_bytes": peak,
        "estimate_bytes": estimate.total_bytes,
        "estimate": estimate.__dict__,
        "ratio_estimate_over_measured": estimate.total_bytes / peak,
        "shape_from_live_model": shape.__dict__,
        "shape_from_config_equal": builtin_model_shape(args.model) == shape,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help=_common.SMOKE_HELP)
    args = parser.parse_args()
    _common.apply_smoke(args, model="tiny-arith", rows=1, length=16, steps=1, threads=1)
    if args.child:
        Path(args.child).write_text(json.dumps(child(args)))
        return 0
    from trainer.models import load_model_and_tokenizer

    load_model_and_tokenizer(args.model, seed=0)  # converts the GGUF once (cached), outside the measurement
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "child.json"
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD, "PYTHONPATH": str(_common.ROOT)}
        cmd = [sys.executable, __file__, "--child", str(out), "--model", args.model]
        cmd += ["--rows", str(args.rows), "--length", str(args.length), "--steps", str(args.steps)]
        cmd += ["--threads", str(args.threads)]
        subprocess.run(cmd, env=env, check=True)
        record = json.loads(out.read_text())
    record["machine"] = _common.machine(torch_threads=args.threads)
    record["load_average"] = os.getloadavg()
    _common.emit(record, args.json, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
