"""Peak RSS per phase of an fsdp2 × 2 run of a from-config model (bench/bench_big_model.py's width, LAYERS layers, 2
RL steps, a checkpoint after each): each trainer process's RSS sampled every 0.05 s, the maximum printed per
interval between the run's events (a step split into generation, the passes before the update, the update by
its perf/ timings), beside the memory estimate. docs/DISTRIBUTED.md, "A model ddp × 2 cannot fit".

    PYTHONPATH=. .venv/bin/python scripts/memory_timeline.py 4
    STARE_HEAP_TUNING=0 MALLOC_MMAP_THRESHOLD_=65536 PYTHONPATH=. .venv/bin/python scripts/memory_timeline.py 4
    ROLLOUT=vllm TRAINER_PYTHON=.venv-vllm/bin/python PYTHONPATH=. .venv/bin/python scripts/memory_timeline.py 2

ROLLOUT=vllm: the rollouts by vLLM (each process's engine fed tensor by tensor from the shards), the trainer
run by TRAINER_PYTHON (vLLM's interpreter); this script's own interpreter needs the service's packages.
"""

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
import psutil  # noqa: E402

from bench.bench_big_model import estimates, job_spec  # noqa: E402
from bench.make_config_model import shape_config, write_model  # noqa: E402

L = int(sys.argv[1])
work = Path(f"/tmp/memtl{L}-{os.environ.get('ROLLOUT', 'hf')}")
work.mkdir(exist_ok=True)
cfg = shape_config(layers=L, hidden=2048, intermediate=5632, heads=32, kv_heads=8)
folder = work / "model"
if not (folder / "config.json").exists():
    write_model(folder, cfg, seed=0)
spec = job_spec(folder, steps=2, processes=2, new_tokens=8)
spec["checkpoint"] = {"interval": 1, "keep_last": 3}
ROLLOUT = os.environ.get("ROLLOUT", "hf")
spec["rollout"] = {"engine": ROLLOUT}
est = estimates(cfg, spec)["fsdp2 x2"]
out = work / "run"
subprocess.run(["rm", "-rf", str(out)])
(work / "spec.json").write_text(json.dumps(spec))
env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
p = subprocess.Popen(
    [
        os.environ.get("TRAINER_PYTHON", sys.executable),
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "trainer",
        "run",
        str(work / "spec.json"),
        "--out",
        str(out),
        "--no-progress",
    ],
    cwd=ROOT,
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
tl = []
while p.poll() is None:
    now = time.time()
    for c in psutil.Process(p.pid).children(recursive=True):
        try:
            if "trainer" in c.cmdline():
                tl.append((now, c.pid, c.memory_info().rss))
        except psutil.Error:
            pass
    time.sleep(0.05)
ev = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def ts(e):
    return datetime.fromisoformat(e["time"]).timestamp()


marks = []
for e in ev:
    t = ts(e)
    if e["type"] == "step":
        m = e["metrics"]
        up = m.get("perf/update_seconds", 0)
        st = m.get("perf/step_seconds", 0)
        gen = m.get("perf/generation_seconds", 0)
        marks += [
            (t - st, f"step{e['step']} start"),
            (t - st + gen, f"step{e['step']} gen end"),
            (t - up, f"step{e['step']} update start"),
            (t, f"step{e['step']} end"),
        ]
    else:
        marks.append((t, f"{e['type']} {e.get('step')}"))
marks.sort()
pids = sorted({x[1] for x in tl})
print(
    "estimate fsdp2x2 per process GB: total {:.2f} training {:.2f}".format(
        est["total_bytes"] / 1e9,
        (
            est["parameters_bytes"]
            + est["gradients_bytes"]
            + est["optimizer_bytes"]
            + est["gathered_bytes"]
            + est["activations_bytes"]
            - est["not_coexisting_bytes"]
        )
        / 1e9,
    ),
    {k: round(v / 1e9, 3) for k, v in est.items() if isinstance(v, int) and v > 1e6},
)
prev = tl[0][0]
for t, name in [*marks, (1e18, "exit")]:
    seg = [x for x in tl if prev <= x[0] < t]
    print(
        f"{name:22s}",
        " ".join(f"{max([x[2] for x in seg if x[1] == pid] or [0]) / 1e9:6.2f}" for pid in pids),
    )
    prev = t
# The run's checkpoints are large (about 15 GB at 4 layers: each holds the shards and a consolidated model/):
# removed; the model folder is kept for the next call.
subprocess.run(["rm", "-rf", str(out)])
