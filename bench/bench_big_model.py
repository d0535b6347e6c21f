"""A model that ddp × 2 cannot fit on this machine, trained under fsdp2 × 2 and resumed at 1 process (issue 34).

1. The size comes from the memory estimate (contract.fleet.estimate_memory, what POST /v1/jobs/estimate
   answers and placement refuses on): the largest Llama of width 2048 (bench/make_config_model.py's shape,
   SmolLM2's tokenizer) whose fsdp2 × 2 job, HF-generate rollout included, fits `--fit-share` of this
   machine's memory in its two processes, and whose ddp × 2 job does not fit the machine at all.
2. Placement against a worker class of this machine (2 processes, MemTotal / 2 per process): ddp × 2 is
   refused naming the spec field (the API answers that with a 422 before any process starts:
   tests/service/test_placement.py), fsdp2 × 2 is placed.
3. `python -m trainer run` under torchrun, fsdp2 × 2, HF generate: `--steps` RL steps from the folder (each
   rank reads its own shards of the safetensors files), a checkpoint after the step before the last and one
   at the end. The last checkpoint is removed and the run resumed at 1 process (fsdp2 × 1) from the one
   before, so the last step is redone at the other size; its metrics are compared with the 2-process step.
4. Peak memory per process: each trainer process's high-water mark (VmHWM, sampled every 0.2 s from
   /proc), against the estimate for that layout.
5. What vLLM rollouts would add (`with_vllm`): per process, vLLM's resident float32 copy and its KV cache
   beside the training step, on paper and projected from the measured peak, against MemTotal / 2.

Run (about 5-10 min on 2 cores; 26 GB of disk at 642 M parameters for the folder and the checkpoints):
  PYTHONPATH=. .venv/bin/python bench/bench_big_model.py --json bench/results/big_model.json
--smoke does the same on a two-layer model of width 64 (seconds), so an API change that breaks it fails
`make test` (tests/bench/test_bench_smoke.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _common

WIDTH = {"hidden": 2048, "intermediate": 5632, "heads": 32, "kv_heads": 8}
SMOKE_WIDTH = {"hidden": 64, "intermediate": 256, "heads": 4, "kv_heads": 2}
# Metrics of the redone step compared between 2 processes and 1 (the same samples at any process count:
# docs/DISTRIBUTED.md); their differences are reported, not asserted (fp32 over 2 shards against 1).
COMPARED = ("entropy/mean", "reward/mean", "loss/policy", "response/length_mean")


def job_spec(folder: Path, *, steps: int, processes: int, new_tokens: int) -> dict[str, Any]:
    return {
        "seed": 0,
        "model": {"name": str(folder)},
        "task": {"source": "arithmetic", "train_size": 64, "eval_size": 0},
        "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
        "algorithm": {"name": "grpo_ds"},
        "sampling": {"group_size": 2, "max_new_tokens": new_tokens},
        "optim": {"lr": 1e-5, "steps": steps, "prompts_per_step": 2, "micro_batch_size": 2},
        "checkpoint": {"interval": max(1, steps - 1), "keep_last": 2},
        "evaluation": {"interval": 0},
        "distributed": {"strategy": "fsdp2", "processes_per_node": processes},
    }


def memory_per_device(job: Any, configs: dict[str, Any]) -> Any:
    """The memory per device placement gives `job` (contract.fleet.place_job, with the prompt bound the
    service reads off the task), on a class that refuses nothing."""
    from contract.fleet import Offer, WorkerClass, place_job
    from service.fleet import prompt_tokens

    unbounded = WorkerClass(queue="bench", processes_per_node=4096, rollout_engines=("hf", "vllm"))
    placed = place_job(
        job,
        [Offer("bench", unbounded, live=False)],
        prompt_tokens=lambda: prompt_tokens(job, None),  # type: ignore[arg-type]  # generated: no storage
        configs=configs,
    )
    assert placed.memory is not None
    return placed.memory


def estimates(config: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """Per-process bytes of the job under ddp × 2, fsdp2 × 2 and fsdp2 × 1, as the service computes them."""
    from contract.spec import TrainSpec

    name = spec["model"]["name"]
    out = {}
    for label, strategy, processes in (
        ("ddp x2", "ddp", 2),
        ("fsdp2 x2", "fsdp2", 2),
        ("fsdp2 x1", "fsdp2", 1),
    ):
        job = {**spec, "distributed": {"strategy": strategy, "processes_per_node": processes}}
        out[label] = memory_per_device(TrainSpec.model_validate(job), {name: config}).model_dump()
    return out


def placement(spec: dict[str, Any], per_process: dict[str, Any], memory_total: int) -> dict[str, Any]:
    """ddp × 2 and fsdp2 × 2 against a worker class of this machine: 2 processes, MemTotal / 2 each."""
    from contract.fleet import CapacityError, JobNeeds, Offer, WorkerClass, place

    box = WorkerClass(name="this-machine", queue="cpu", processes_per_node=2,
                      memory_per_device_bytes=memory_total // 2)  # fmt: skip
    offer = Offer("declared class 'this-machine'", box, live=False)
    out = {}
    for label, strategy in (("ddp x2", "ddp"), ("fsdp2 x2", "fsdp2")):
        needs = JobNeeds(strategy=strategy, nodes=1, processes_per_node=2, rollout_engine="hf",
                         memory_per_device_bytes=per_process[label]["total_bytes"],
                         memory_param="spec.distributed.strategy")  # fmt: skip
        try:
            place(needs, [offer])
            out[label] = {"placed": True}
        except CapacityError as err:
            out[label] = {"placed": False, "param": err.param, "message": err.message}
    return out


def with_vllm(config: dict[str, Any], spec: dict[str, Any], memory_total: int, peak: int) -> dict[str, Any]:
    """What fsdp2 × 2 with vLLM rollouts would hold per process on this CPU machine, beside the HF run's:
    the training step's estimate (no gathered copy for the rollout: vLLM is fed tensor by tensor), plus
    vLLM's resident copy of the weights (float32 on the CPU) and its KV cache, which stay beside the
    training state (no sleep mode on the CPU): contract.fleet's vllm_cpu_resident_bytes, what placement
    counts on a CPU class. On paper (the estimate) and projected from this run's measured peak (HF
    generate's peak was in the update, not the rollout: vLLM's copy adds to it)."""
    from contract.catalog import model_shape_from_config
    from contract.fleet import GIB, VLLM_CPU_KV_CACHE_GIB, vllm_cpu_resident_bytes
    from contract.spec import TrainSpec

    name = spec["model"]["name"]
    job = TrainSpec.model_validate({**spec, "rollout": {"engine": "vllm"}})
    memory = memory_per_device(job, {name: config})
    kv = VLLM_CPU_KV_CACHE_GIB * GIB
    weights = vllm_cpu_resident_bytes(job, model_shape_from_config(config)) - kv  # what placement counts
    per_device = memory_total // 2
    on_paper = memory.total_bytes + weights + kv
    projected = peak + weights + kv
    return {
        "training_step_bytes": memory.total_bytes,
        "vllm_weights_bytes": weights,
        "vllm_kv_cache_bytes": kv,
        "per_process_on_paper_bytes": on_paper,
        "per_process_projected_from_the_measured_peak_bytes": projected,
        "per_process_available_bytes": per_device,
        "fits_on_paper": on_paper <= per_device,
        "fits_as_measured": projected <= per_device,
    }


def pick_layers(memory_total: int, fit_share: float, new_tokens: int) -> int:
    """The most layers at WIDTH whose fsdp2 × 2 job fits fit_share of the machine (both processes)."""
    from bench.make_config_model import shape_config
    from contract.spec import TrainSpec

    best = 1
    for layers in range(1, 64):
        config = shape_config(layers=layers, **WIDTH)
        spec = job_spec(Path("/sizing"), steps=3, processes=2, new_tokens=new_tokens)
        memory = memory_per_device(TrainSpec.model_validate(spec), {"/sizing": config})
        if 2 * memory.total_bytes > fit_share * memory_total:
            break
        best = layers
    return best


class PeakSampler:
    """VmHWM of every `python -m trainer` process under a launcher, sampled until stopped."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                procs = [
                    psutil.Process(self.root_pid),
                    *psutil.Process(self.root_pid).children(recursive=True),
                ]
            except psutil.Error:
                procs = []
            for proc in procs:
                try:
                    if "trainer" not in proc.cmdline():
                        continue
                    status = Path(f"/proc/{proc.pid}/status").read_text()
                except (psutil.Error, OSError):
                    continue
                for line in status.splitlines():
                    if line.startswith("VmHWM:"):
                        self.peaks[proc.pid] = max(self.peaks.get(proc.pid, 0), int(line.split()[1]) * 1024)
            self._stop.wait(0.2)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        return sorted(self.peaks.values(), reverse=True)


def launch(spec: dict[str, Any], out: Path, processes: int, resume: bool, timeout: float) -> dict[str, Any]:
    spec_path = out.parent / f"{out.name}-{processes}.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable]
    if processes > 1:
        cmd += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    cmd += ["-m", "trainer", "run", str(spec_path), "--out", str(out), "--no-progress"]
    if resume:
        cmd.append("--resume")
    env = {
        **os.environ,
        "PYTHONPATH": str(_common.ROOT),
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=_common.ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = PeakSampler(proc.pid)
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        peaks = sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"the {processes}-process run failed ({proc.returncode}):\n{err.decode()[-3000:]}")
    # The launcher itself is a python process too; the trainer processes are the largest.
    return {"seconds": round(time.perf_counter() - started, 1), "peak_rss_bytes": peaks[:processes]}


def steps_of(out: Path) -> dict[int, dict[str, float]]:
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return {e["step"]: e["metrics"] for e in events if e["type"] == "step"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--fit-share", type=float, default=0.6, help="of MemTotal, for both fsdp2 processes")
    parser.add_argument("--layers", type=int, default=None, help="default: picked from the estimate")
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="folder for the model and runs, kept (26 GB at 642 M parameters); default: a temporary one, removed",
    )
    parser.add_argument("--json", default=None)
    parser.add_argument("--smoke", action="store_true", help=_common.SMOKE_HELP)
    args = parser.parse_args(argv)

    import psutil

    from bench.make_config_model import shape_config, write_model

    memory_total = psutil.virtual_memory().total
    width = SMOKE_WIDTH if args.smoke else WIDTH
    steps = 2 if args.smoke else args.steps
    new_tokens = 4 if args.smoke else args.new_tokens
    layers = 2 if args.smoke else (args.layers or pick_layers(memory_total, args.fit_share, new_tokens))
    config = shape_config(layers=layers, **width)
    work = args.work or Path(tempfile.mkdtemp(prefix="stare-big-model-"))
    work.mkdir(parents=True, exist_ok=True)
    folder = work / f"llama-{layers}x{width['hidden']}"
    try:
        if not (folder / "config.json").is_file():
            parameters = write_model(folder, config, seed=0)
        else:
            from contract.catalog import model_shape_from_config

            parameters = model_shape_from_config(config).parameters
        spec = job_spec(folder, steps=steps, processes=2, new_tokens=new_tokens)
        per_process = estimates(config, spec)
        placed = placement(spec, per_process, memory_total)
        if not args.smoke and (placed["ddp x2"]["placed"] or not placed["fsdp2 x2"]["placed"]):
            raise SystemExit(f"the size does not separate ddp from fsdp2 here: {placed}")

        two = work / "run"
        shutil.rmtree(two, ignore_errors=True)
        run2 = launch(spec, two, 2, resume=False, timeout=3600)
        before = steps_of(two)
        # Resume at 1 process from the checkpoint before the last step: the last step is redone there.
        shutil.rmtree(two / "checkpoints" / f"step-{steps:06d}")
        one_spec = job_spec(folder, steps=steps, processes=1, new_tokens=new_tokens)
        run1 = launch(one_spec, two, 1, resume=True, timeout=3600)
        after = steps_of(two)
        redone = {k: {"2 processes": before[steps][k], "1 process": after[steps][k]} for k in COMPARED}
        result = {
            "bench": "big_model",
            "smoke": args.smoke,
            "machine": _common.machine(torch_threads=1),
            "parameters": parameters,
            "config": config,
            "steps": steps,
            "estimate_per_process": per_process,
            "placement_on_this_machine": placed,
            "fsdp2 x2": {**run2, "estimate_bytes": per_process["fsdp2 x2"]["total_bytes"]},
            "resumed at fsdp2 x1": {**run1, "estimate_bytes": per_process["fsdp2 x1"]["total_bytes"]},
            "peak_over_estimate": {
                "fsdp2 x2": [
                    round(p / per_process["fsdp2 x2"]["total_bytes"], 3) for p in run2["peak_rss_bytes"]
                ],
                "fsdp2 x1": [
                    round(p / per_process["fsdp2 x1"]["total_bytes"], 3) for p in run1["peak_rss_bytes"]
                ],
            },
            "with_vllm_per_process": with_vllm(config, spec, memory_total, max(run2["peak_rss_bytes"])),
            "redone_step": redone,
            "steps_logged": sorted(after),
        }
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    _common.emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
