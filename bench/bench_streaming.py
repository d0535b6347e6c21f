"""Overhead of per-step metric streaming on the trainer's step time (issue 5).

Side by side, interleaved (A, B, A, B, ...), the same tiny-model job:
  A. standalone: `python -m trainer run SPEC --out DIR` (events to events.jsonl only);
  B. supervised: the same command started by the worker's TrainerProcess with --events-stdout, every event
     recorded through the worker's Recorder into PostgreSQL (metric rows, checkpoint rows, heartbeats),
     exactly as a Celery worker does it.
The figure is the median of the trainer's own `perf/step_seconds` over all steps of each run (warm-up steps
dropped), B/A − 1. Target: ≤ 2 %.

    .venv/bin/python bench/bench_streaming.py [--rounds 3] [--steps 40] [--json bench/results/streaming.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _common
import yaml
from psycopg import sql

from contract.spec import TrainSpec
from store import migrate, repository
from store.database import Database
from worker.settings import WorkerSettings

ROOT = _common.ROOT

WARMUP_STEPS = 3


def spec(steps: int) -> dict[str, Any]:
    return {
        "seed": 7,
        "model": {"name": "tiny-arith"},
        "task": {"source": "arithmetic", "train_size": 256, "eval_size": 0},
        "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
        "sampling": {"group_size": 8, "max_new_tokens": 8},
        "optim": {"steps": steps, "prompts_per_step": 8, "micro_batch_size": 64},
        "checkpoint": {"interval": 10, "keep_last": 2},
    }


def step_seconds(events_path: Path) -> list[float]:
    values = []
    for line in events_path.read_text().splitlines():
        event = json.loads(line)
        if event["type"] == "step" and event["step"] > WARMUP_STEPS:
            values.append(float(event["metrics"]["perf/step_seconds"]))
    return values


def run_standalone(spec_path: Path, out: Path) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-m", "trainer", "run", str(spec_path), "--out", str(out), "--no-progress"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return step_seconds(out / "events.jsonl")


def run_supervised(
    db: Database, settings: WorkerSettings, job_spec: dict[str, Any], root: Path
) -> list[float]:
    from worker.training import run_claimed

    resolved = TrainSpec.model_validate(job_spec).resolved()
    with db.transaction() as session:
        tenant = repository.create_tenant(session, f"bench-{uuid.uuid4().hex[:8]}")
    job, _ = asyncio.run(
        repository.create_job(
            db.async_pool,
            repository.NewJob(
                tenant_id=tenant.id,
                name=None,
                spec=job_spec,
                resolved_spec=resolved,
                spec_hash="0" * 64,
                model="tiny-arith",
                algorithm=resolved["algorithm"]["name"],
                queue="bench",
                training_file_id=None,
                metadata={},
                total_steps=job_spec["optim"]["steps"],
                max_attempts=1,
            ),
        )
    )
    with db.transaction() as session:
        claim = repository.claim_job(session, job.id, owner="bench", lease_s=600)
    assert claim is not None
    status = run_claimed(db, claim, settings, lambda job_id, queue: None)
    assert status == "succeeded", status
    with db.sessions() as session:
        rows, _ = repository.list_metrics(session, job.id, since_step=0, until_step=None, limit=10_000)
    assert [row.step for row in rows] == list(range(1, job_spec["optim"]["steps"] + 1))
    return step_seconds(root / claim.run_dir / "events.jsonl")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "streaming.json"))
    parser.add_argument("--smoke", action="store_true", help=_common.SMOKE_HELP)
    parser.add_argument(
        "--postgres-url", default=_common.DEFAULT_POSTGRES_URL, help=_common.POSTGRES_URL_HELP
    )
    args = parser.parse_args()
    _common.apply_smoke(args, rounds=1, steps=WARMUP_STEPS + 2)

    name, url, admin = _common.create_database(args.postgres_url, "stare_bench_stream")
    results: dict[str, list[float]] = {"standalone": [], "supervised": []}
    try:
        migrate.upgrade(url)
        db = Database(url, pool_size=2)
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            settings = WorkerSettings(
                database_url=url, artifact_root=root, broker_url="redis://127.0.0.1:6379/15"
            )
            job_spec = spec(args.steps)
            spec_path = root / "spec.yaml"
            spec_path.write_text(yaml.safe_dump(job_spec))
            for r in range(args.rounds):
                t0 = time.time()
                results["standalone"] += run_standalone(spec_path, root / f"standalone-{r}")
                results["supervised"] += run_supervised(db, settings, job_spec, root)
                print(f"round {r + 1}/{args.rounds} done in {time.time() - t0:.0f} s", flush=True)
        db.dispose()
    finally:
        with admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    a = statistics.median(results["standalone"])
    b = statistics.median(results["supervised"])
    summary = {
        "steps_per_run": args.steps,
        "rounds": args.rounds,
        "standalone_median_step_s": a,
        "supervised_median_step_s": b,
        "overhead": b / a - 1.0,
        "load_average": os.getloadavg(),
    }
    print("| run | median step (s) |\n|---|---|")
    print(
        f"| standalone trainer | {a:.4f} |\n| supervised by the worker, recording to PostgreSQL | {b:.4f} |"
    )
    print(
        f"overhead: {100 * summary['overhead']:+.2f} % (target ≤ 2 %); load average {summary['load_average']}"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
