"""SmolLM2 with vLLM rollouts under ddp × 2 and fsdp2 × 2: the same 2 RL steps, compared (docs/DISTRIBUTED.md,
"vLLM rollouts above one process"). The SmolLM2 suite's task (a+b, chat template, numeric verifier, T 0.7),
grpo_ds, 4 prompts × 8 samples, seed 0, run by `python -m trainer run` under torchrun in vLLM's venv.
Prints the step metrics that matter, the largest difference between the two runs, and each run's peak RSS
per trainer process (VmHWM, sampled every 0.2 s) with its model state per process: under fsdp2 the model
state halves, and a full gathered copy of the weights beside vLLM's (what the tensor-by-tensor feed avoids)
would give some of that back at the rollout.

    .venv-vllm/bin/python scripts/vllm_strategies_smollm2.py OUT_DIR      # about 2.5 min on 2 cores
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.smollm2 import base_spec  # noqa: E402
from tests.trainer.launch import run_trainer  # noqa: E402
from tests.trainer.test_engine import read_events, step_metrics  # noqa: E402

KEYS = ("rollout/mismatch_abs_max", "reward/mean", "actor/grad_norm", "memory/model_state_bytes")


class PeakRss:
    """The VmHWM of every trainer process whose command line names `marker`, sampled until stopped."""

    def __init__(self, marker: str) -> None:
        self.marker, self.peaks = marker, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            for proc in psutil.process_iter(["pid", "cmdline"]):
                cmdline = " ".join(proc.info["cmdline"] or ())
                if (
                    self.marker not in cmdline
                    or "trainer" not in cmdline
                    or "torch.distributed.run" in cmdline
                ):
                    continue
                try:
                    status = Path(f"/proc/{proc.info['pid']}/status").read_text()
                except OSError:
                    continue
                for line in status.splitlines():
                    if line.startswith("VmHWM:"):
                        peak = int(line.split()[1]) * 1024
                        self.peaks[proc.info["pid"]] = max(self.peaks.get(proc.info["pid"], 0), peak)
            self._stop.wait(0.2)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        return sorted(self.peaks.values(), reverse=True)


def main(out_dir: Path) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = {}
    for strategy in ("ddp", "fsdp2"):
        spec = base_spec(2e-5)
        spec.pop("algorithm", None)
        spec.update(
            seed=0,
            algorithm={"name": "grpo_ds"},
            optim={"steps": 2, "lr": 2e-5, "prompts_per_step": 4, "micro_batch_size": 32},
            rollout={"engine": "vllm", "tis_cap": 2.0},
            distributed={"strategy": strategy, "processes_per_node": 2},
            checkpoint={"interval": 100, "keep_last": 1},
        )
        spec["task"]["eval_size"] = 0
        started = time.time()
        sampler = PeakRss(str(out_dir / strategy))
        run = run_trainer(out_dir, strategy, spec, processes=2, timeout=1500)
        runs[strategy] = {
            "seconds": round(time.time() - started, 1),
            "steps": step_metrics(read_events(run)),
            "peak_rss_bytes": sampler.stop(),
        }
    ddp, fsdp2 = runs["ddp"]["steps"], runs["fsdp2"]["steps"]
    compared = [
        (abs(fsdp2[s][k] - v), s, k)
        for s in ddp
        for k, v in ddp[s].items()
        if not k.startswith(("memory/", "perf/"))
    ]
    summary = {
        "seconds": {name: run["seconds"] for name, run in runs.items()},
        **{
            key: {name: [run["steps"][s][key] for s in sorted(run["steps"])] for name, run in runs.items()}
            for key in KEYS
        },
        "largest_difference": max(compared),
        "peak_rss_bytes": {name: run["peak_rss_bytes"] for name, run in runs.items()},
    }
    text = json.dumps(summary, indent=1)
    print(text)
    (out_dir / "summary.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
