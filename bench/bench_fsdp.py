"""FSDP2 against DDP at two processes: training step time and what each process holds (issue 23).

For each strategy the script launches itself under `torchrun --nproc-per-node 2` (gloo on CPU, NCCL where
CUDA is there), loads the model in every process, prepares it with the run's strategy
(trainer.distributed.Runtime.strategy), and runs AdamW steps of a token-mean cross-entropy on random tokens
(`--rows` rows of `--length` tokens per process, no padding). The first `--warmup` steps are not timed;
each timed step runs between two barriers, so its wall time is the slower process's. Per process it records:
  - the median step time (wall) and the CPU time of the process over the timed steps;
  - parameter, gradient and optimizer bytes it holds (trainer.distributed.model_state_bytes: the local
    shard of a DTensor), taken after the last backward, before its optimizer step;
  - peak RSS during the steps: the high-water mark is reset (trainer.distributed.memory) after the model is
    wrapped, so the transient of loading the full model in every process is not counted, and the RSS at
    that point is reported beside it;
  - contract.fleet.estimate_memory's figure for the same step.
The children run with MALLOC_MMAP_THRESHOLD_=65536 (bytes), so glibc returns every freed block above 64 KiB
and RSS follows live memory (docs/DISTRIBUTED.md, "Memory"); the engine's own heap setting
(trainer/run/heap.py) would instead keep freed blocks for reuse. Reported ratios are fsdp2 / ddp (< 1: fsdp2
uses less / is faster), per round and their median over `--rounds` rounds; a round launches both strategies,
in an order that alternates between rounds, since on a shared machine the load drifts between launches.

Run:
  PYTHONPATH=. .venv/bin/python bench/bench_fsdp.py --model tiny-arith --json bench/results/fsdp_tiny.json
  PYTHONPATH=. .venv/bin/python bench/bench_fsdp.py --model smollm2-135m-instruct --rows 4 --length 128 \
      --steps 5 --json bench/results/fsdp_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common

STRATEGIES = ("ddp", "fsdp2")
PROCESSES = 2


def child(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F

    from contract.distributed import DistributedSpec
    from contract.fleet import estimate_memory
    from trainer.distributed import Runtime, model_state_bytes
    from trainer.distributed.memory import model_shape, peak_rss_bytes, reset_peak_rss, rss_bytes
    from trainer.models import load_model_and_tokenizer

    torch.set_num_threads(args.threads)
    device = (
        torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    spec = DistributedSpec(strategy=args.child, processes_per_node=int(os.environ["WORLD_SIZE"]))
    runtime = Runtime(spec, device)
    rank, world = runtime.rank, runtime.world_size
    model, _ = load_model_and_tokenizer(args.model, seed=0)
    shape = model_shape(model)
    model.train()
    model = runtime.strategy.prepare(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    generator = torch.Generator().manual_seed(rank)
    vocab = shape.vocab_size
    reset_peak_rss()
    rss_after_wrap = rss_bytes()
    wall_s, held = [], {}
    cpu_start = time.process_time()
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            cpu_start = time.process_time()
        ids = torch.randint(0, vocab, (args.rows, args.length), generator=generator).to(device)  # (B, T)
        runtime.barrier()
        start = time.perf_counter()
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        if step == args.warmup + args.steps - 1:
            held = model_state_bytes(model, optimizer)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss
        runtime.barrier()
        if step >= args.warmup:
            wall_s.append(time.perf_counter() - start)
    estimate = estimate_memory(
        shape, strategy=spec.strategy, processes=world, micro_batch_tokens=args.rows * args.length
    )
    record = {
        "rank": rank,
        "step_wall_s_median": statistics.median(wall_s),
        "step_wall_s": wall_s,
        "cpu_s_per_step": (time.process_time() - cpu_start) / args.steps,
        "rss_after_wrap_bytes": rss_after_wrap,
        "peak_rss_bytes": peak_rss_bytes(),
        **held,
        "estimate_bytes": estimate.total_bytes,
        "estimate": estimate.__dict__,
    }
    Path(args.out).with_suffix(f".rank{rank}.json").write_text(json.dumps(record))
    torch.distributed.destroy_process_group()


def launch(args: argparse.Namespace, strategy: str, folder: Path) -> list[dict[str, Any]]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = folder / f"{strategy}.json"
    cmd = [  # torchrun, as this interpreter's module (a venv's bin/ need not be on PATH)
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(PROCESSES),
        "--master-port",
        str(port),
        __file__,
    ]
    cmd += ["--child", strategy, "--out", str(out), "--model", args.model, "--rows", str(args.rows)]
    cmd += ["--length", str(args.length), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    cmd += ["--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": str(_common.ROOT), "OMP_NUM_THREADS": str(args.threads)}
    env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{strategy} failed:\n{done.stderr[-4000:]}")
    return [json.loads(out.with_suffix(f".rank{r}.json").read_text()) for r in range(PROCESSES)]


def summarise(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def worst(strategy: str, key: str) -> float:
        return float(max(rank[key] for rank in results[strategy]))

    keys = ["step_wall_s_median", "cpu_s_per_step", "peak_rss_bytes", "parameters_bytes", "gradients_bytes"]
    keys += ["optimizer_bytes", "estimate_bytes"]
    summary: dict[str, Any] = {s: {k: worst(s, k) for k in keys} for s in STRATEGIES}
    for s in STRATEGIES:
        summary[s]["model_state_bytes"] = sum(
            summary[s][k] for k in ("parameters_bytes", "gradients_bytes", "optimizer_bytes")
        )
        summary[s]["peak_rss_above_wrap_bytes"] = max(
            r["peak_rss_bytes"] - r["rss_after_wrap_bytes"] for r in results[s]
        )
    ratio_keys = ["step_wall_s_median", "cpu_s_per_step", "peak_rss_bytes", "peak_rss_above_wrap_bytes"]
    ratio_keys += ["model_state_bytes", "estimate_bytes"]
    summary["fsdp2_over_ddp"] = {k: summary["fsdp2"][k] / summary["ddp"][k] for k in ratio_keys}
    return summary


def cpu_model() -> dict[str, Any]:
    """The CPU's model name and whether it has AVX-512 (torch's kernels, hence timings, differ with it)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return {"model_name": fields.get("model name"), "avx512f": "avx512f" in fields.get("flags", "").split()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-arith")
    parser.add_argument("--rows", type=int, default=8, help="rows per process per step")
    parser.add_argument("--length", type=int, default=128, help="tokens per row")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="launches per strategy, alternating")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", choices=STRATEGIES, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help=_common.SMOKE_HELP)
    args = parser.parse_args()
    _common.apply_smoke(args, rows=2, length=16, steps=1, warmup=0, rounds=1)
    if args.child:
        child(args)
        return
    rounds: list[dict[str, list[dict[str, Any]]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            order = STRATEGIES if i % 2 == 0 else STRATEGIES[::-1]  # alternate, so drifting load hits both
            rounds.append({s: launch(args, s, Path(tmp)) for s in order})
    summaries = [summarise(r) for r in rounds]
    ratios = {
        k: statistics.median(s["fsdp2_over_ddp"][k] for s in summaries)
        for k in summaries[0]["fsdp2_over_ddp"]
    }
    report = {
        "model": args.model,
        "processes": PROCESSES,
        "rows_per_process": args.rows,
        "length": args.length,
        "steps": args.steps,
        "load_average_1m": os.getloadavg()[0],
        "machine": _common.machine("transformers", torch_threads=args.threads),
        "cpu": cpu_model(),
        "rounds": [{"per_rank": r, "summary": s} for r, s in zip(rounds, summaries, strict=True)],
        "fsdp2_over_ddp_median": ratios,
    }
    print(json.dumps({"rounds": [s["fsdp2_over_ddp"] for s in summaries], "median": ratios}, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
