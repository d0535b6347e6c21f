"""Peak RSS per process at start under fsdp2 × 2: three ways of filling the shards, side by side (issue 34).

For each way the script launches itself under `torchrun --nproc-per-node 2` (gloo on CPU), builds and
prepares the model with the strategy (trainer.distributed.Runtime.strategy) and records, per process, the
high-water mark of its RSS (VmHWM, /proc/self/status; trainer.distributed.memory) once the model is
prepared, before any step, and its RSS before the load began:
  - `full`: every process loads the whole model (trainer.models.load_model_and_tokenizer), then shards it
    (`prepare(model)`): the load before issue 34's rank-0 fill, and the reference of the ratios;
  - `rank0`: rank 0 loads the whole model, the other process builds a skeleton on the meta device, and
    rank 0's tensors are broadcast into the shards (`prepare(model, from_rank0=True)`): what a fresh run
    did before the files path, and still does for a model built in code (tiny-arith) or with LoRA;
  - `files`: every process builds the skeleton, shards it, allocates its shards only and reads its own
    slice of each tensor from the safetensors files (`prepare(model, from_files=...)`,
    trainer.distributed.shard_load): what a fresh run does where the weights are such files.
Beside them, the peak RSS of a plain interpreter with torch and transformers imported (`baseline`), so that
the model's share of each peak (peak − baseline) is visible. Ratios are each way's peak over `full`'s, per
rank, and the larger of the two ranks' (the target of issue 34: ≤ 0.6). The children run with glibc's
default allocator settings and one torch thread; the ways run one after another, each in fresh processes.

Run:
  PYTHONPATH=. nice -n 5 .venv/bin/python bench/bench_start_memory.py --json bench/results/start_memory.json
  PYTHONPATH=. .venv/bin/python bench/bench_start_memory.py --model /path/to/hf-folder --json OUT
--smoke writes a two-layer model with bench/make_config_model.py and measures that.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _common
from bench_fsdp import cpu_model  # the CPU model name and whether it has AVX-512

WAYS = ("full", "rank0", "files")
PROCESSES = 2
SMOKE_SHAPE = ["--layers", "2", "--hidden", "64", "--intermediate", "256", "--heads", "4", "--kv-heads", "2"]
MIB = 1 << 20


def child(args: argparse.Namespace) -> None:
    import torch

    from contract.distributed import DistributedSpec
    from trainer.distributed import Runtime, model_state_bytes
    from trainer.distributed.memory import peak_rss_bytes, rss_bytes
    from trainer.models import load_model_and_tokenizer, skeleton_of, weights_files

    torch.set_num_threads(1)
    device = torch.device("cpu")
    spec = DistributedSpec(strategy="fsdp2", processes_per_node=int(os.environ["WORLD_SIZE"]))
    runtime = Runtime(spec, device)  # the group, and the strategy made for it
    rank = runtime.rank
    skeleton_of(args.model)  # converts SmolLM2's GGUF once, if no process did before (not measured)
    runtime.barrier()
    rss_before = rss_bytes()
    peak_before = peak_rss_bytes()
    strategy = runtime.strategy
    model: Any
    if args.child == "full" or (args.child == "rank0" and rank == 0):
        model, _ = load_model_and_tokenizer(args.model)
    else:
        built = skeleton_of(args.model)
        if built is None:
            raise SystemExit(f"{args.model}: no skeleton without loading the weights")
        model = built[0]
    if args.child == "files":
        files = weights_files(args.model)
        if files is None:
            raise SystemExit(f"{args.model}: its weights are not safetensors files")
        model = strategy.prepare(model, from_files=files)
    else:
        model = strategy.prepare(model, from_rank0=args.child == "rank0")
    runtime.barrier()
    record = {
        "rank": rank,
        "rss_before_load_bytes": rss_before,
        "peak_rss_before_load_bytes": peak_before,
        "peak_rss_bytes": peak_rss_bytes(),
        "rss_after_prepare_bytes": rss_bytes(),
        "parameters_bytes": model_state_bytes(model, None)["parameters_bytes"],
    }
    Path(args.out).with_suffix(f".rank{rank}.json").write_text(json.dumps(record))
    torch.distributed.destroy_process_group()


def baseline() -> None:
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from trainer.distributed.memory import peak_rss_bytes, rss_bytes

    print(json.dumps({"peak_rss_bytes": peak_rss_bytes(), "rss_bytes": rss_bytes()}))


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(_common.ROOT),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def launch(args: argparse.Namespace, way: str, folder: Path) -> list[dict[str, Any]]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = folder / f"{way}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]
    cmd += ["--nproc-per-node", str(PROCESSES), "--master-port", str(port), __file__]
    cmd += ["--child", way, "--out", str(out), "--model", args.model]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{way} failed:\n{done.stderr[-4000:]}")
    return [json.loads(out.with_suffix(f".rank{r}.json").read_text()) for r in range(PROCESSES)]


def measure_baseline() -> dict[str, int]:
    cmd = [sys.executable, __file__, "--baseline"]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def summarise(results: dict[str, list[dict[str, Any]]], base: dict[str, int]) -> dict[str, Any]:
    """Per way: each rank's peak, its model share (peak − baseline) and its ratio to `full`'s same rank;
    `worst_ratio`: the larger rank's peak over the larger rank's full-load peak."""
    full_peaks = [r["peak_rss_bytes"] for r in results["full"]]
    summary: dict[str, Any] = {}
    for way, ranks in results.items():
        peaks = [r["peak_rss_bytes"] for r in ranks]
        summary[way] = {
            "peak_rss_bytes": peaks,
            "model_share_bytes": [p - base["peak_rss_bytes"] for p in peaks],
            "above_start_bytes": [r["peak_rss_bytes"] - r["rss_before_load_bytes"] for r in ranks],
            "ratio_to_full": [p / f for p, f in zip(peaks, full_peaks, strict=True)],
            "worst_ratio_to_full": max(peaks) / max(full_peaks),
        }
    return summary


def markdown(summary: dict[str, Any], base: dict[str, int], results: dict[str, list[dict[str, Any]]]) -> str:
    head = (
        "| way | peak r0 / r1 (MiB) | − baseline r0 / r1 (MiB) | − RSS before the load r0 / r1 (MiB) "
        "| ratio to full r0 / r1 | max rank / max full |"
    )
    lines = [head, "|---|---|---|---|---|---|"]
    for way in WAYS:
        s = summary[way]
        p, m, a, r = s["peak_rss_bytes"], s["model_share_bytes"], s["above_start_bytes"], s["ratio_to_full"]
        lines.append(
            f"| {way} | {p[0] / MIB:.0f} / {p[1] / MIB:.0f} | {m[0] / MIB:.0f} / {m[1] / MIB:.0f} "
            f"| {a[0] / MIB:.0f} / {a[1] / MIB:.0f} | {r[0]:.2f} / {r[1]:.2f} | {s['worst_ratio_to_full']:.2f} |"
        )
    params = results["files"][0]["parameters_bytes"]
    lines.append("")
    lines.append(
        f"Baseline (torch + transformers imported): peak {base['peak_rss_bytes'] / MIB:.0f} MiB. "
        f"One process's parameter shard: {params / MIB:.0f} MiB."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a name or a local HF folder")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", choices=WAYS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help=_common.SMOKE_HELP)
    args = parser.parse_args()
    if args.baseline:
        baseline()
        return
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            args.model = str(Path(tmp) / "model")
            make = [sys.executable, str(_common.ROOT / "bench" / "make_config_model.py"), args.model]
            subprocess.run([*make, *SMOKE_SHAPE], env=_env(), capture_output=True, text=True, check=True)
        base = measure_baseline()
        results = {way: launch(args, way, Path(tmp)) for way in WAYS}
    summary = summarise(results, base)
    table = markdown(summary, base, results)
    print(table)
    report = {
        "model": "make_config_model.py " + " ".join(SMOKE_SHAPE) if args.smoke else args.model,
        "processes": PROCESSES,
        "baseline": base,
        "ranks": results,
        "summary": summary,
        "markdown": table,
        "cpu": cpu_model(),
        "machine": _common.machine("transformers"),
        "smoke": args.smoke,
    }
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
