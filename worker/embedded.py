"""The embedded stack: the whole product on one machine with nothing else running.

SQLite (WAL) instead of PostgreSQL, Celery's filesystem transport instead of Redis, one local worker with
its sweeper, and the API under uvicorn, all under one home folder. `run_job_over_http` submits a job spec
over HTTP exactly as a user would, follows its progress, and fetches the evaluation report.

    python -m worker embedded --spec trainer/specs/demo.yaml [--home .stare] [--port 8765]
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from store import migrate, repository
from store.database import Database

TERMINAL = ("succeeded", "failed", "cancelled")


def embedded_env(home: Path) -> dict[str, str]:
    home = home.resolve()
    return {
        "STARE_ENVIRONMENT": "development",
        "STARE_DATABASE_URL": f"sqlite:///{home / 'stare.db'}",
        "STARE_ARTIFACT_ROOT": str(home / "artifacts"),
        "STARE_BROKER_URL": "filesystem://",
        "STARE_BROKER_FOLDER": str(home / "broker"),
        "STARE_HEARTBEAT_S": "5",
        "STARE_STALE_AFTER_S": "30",
        "STARE_SWEEP_INTERVAL_S": "5",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tenant_key(database_url: str) -> str:
    db = Database(database_url, pool_size=1)
    try:
        with db.transaction() as session:
            tenant = repository.get_tenant_by_name(session, "embedded") or repository.create_tenant(
                session, "embedded"
            )
            _, secret = repository.create_api_key(session, tenant.id, f"embedded-{int(time.time())}")
        return secret
    finally:
        db.dispose()


@contextlib.contextmanager
def embedded_stack(home: Path, port: int | None = None) -> Iterator[tuple[str, str]]:
    """Starts API + worker under `home`; yields (base URL, API key); stops both on exit."""
    env_vars = embedded_env(home)
    for key in ("STARE_ARTIFACT_ROOT", "STARE_BROKER_FOLDER"):
        Path(env_vars[key]).mkdir(parents=True, exist_ok=True)
    migrate.upgrade(env_vars["STARE_DATABASE_URL"])
    api_key = _tenant_key(env_vars["STARE_DATABASE_URL"])
    port = port or _free_port()
    env = {
        **os.environ,
        **env_vars,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH", "")])),
    }
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        api_log = stack.enter_context(open(logs / "api.log", "ab"))
        worker_log = stack.enter_context(open(logs / "worker.log", "ab"))
        api = [sys.executable, "-m", "service", "serve", "--host", "127.0.0.1", "--port", str(port)]
        procs = [
            subprocess.Popen(api, env=env, stdout=api_log, stderr=subprocess.STDOUT),
            subprocess.Popen(
                [sys.executable, "-m", "worker", "run", "--sweep"],
                env=env,
                stdout=worker_log,
                stderr=subprocess.STDOUT,
            ),
        ]
        yield from _serve(procs, port, logs, api_key)


def _serve(
    procs: list[subprocess.Popen[bytes]], port: int, logs: Path, api_key: str
) -> Iterator[tuple[str, str]]:
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            if time.time() > deadline or procs[0].poll() is not None:
                raise RuntimeError(f"the API did not start; see {logs / 'api.log'}")
            time.sleep(0.3)
        yield base, api_key
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def run_job_over_http(
    base: str, api_key: str, spec: dict[str, Any], out: Path, *, timeout_s: float = 3600
) -> dict[str, Any]:
    """POST the spec, follow it to the end, save report.html/json under `out`; returns the final job object."""
    headers = {"Authorization": f"Bearer {api_key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
        created = client.post(
            "/v1/jobs", json={"spec": spec}, headers={"Idempotency-Key": f"embedded-{time.time_ns()}"}
        )
        if created.status_code != 201:
            raise RuntimeError(f"job rejected ({created.status_code}): {created.text}")
        job = created.json()
        print(f"submitted {job['id']} ({job['algorithm']} on {job['model']}); following it", flush=True)
        deadline = time.time() + timeout_s
        last_line = ""
        while job["status"] not in TERMINAL:
            if time.time() > deadline:
                raise TimeoutError(f"job {job['id']} did not finish in {timeout_s:.0f} s")
            time.sleep(1.0)
            job = client.get(f"/v1/jobs/{job['id']}").json()
            line = _progress_line(job)
            if line != last_line:
                print(line, flush=True)
                last_line = line
        out.mkdir(parents=True, exist_ok=True)
        report = client.get(f"/v1/jobs/{job['id']}/report")
        if report.status_code == 200:
            (out / "report.json").write_text(json.dumps(report.json(), indent=2))
            html = client.get(f"/v1/jobs/{job['id']}/report", params={"format": "html"})
            if html.status_code == 200:
                (out / "report.html").write_text(html.text)
        checkpoints = client.get(f"/v1/jobs/{job['id']}/checkpoints").json().get("data", [])
        job["checkpoints"] = [c["id"] for c in checkpoints]
        return dict(job)


def _progress_line(job: dict[str, Any]) -> str:
    progress = job.get("progress") or {}
    entropy = job.get("entropy") or {}
    metrics = (job.get("latest_metrics") or {}).get("values") or {}
    parts = [f"[{job['status']}]", f"step {progress.get('step', 0)}/{progress.get('total_steps', '?')}"]
    if entropy.get("value") is not None:
        parts.append(f"entropy {entropy['value']:.3f} ({entropy.get('state')})")
    if metrics.get("reward/accuracy") is not None:
        parts.append(f"accuracy {metrics['reward/accuracy']:.2f}")
    return "  ".join(parts)


def main(spec_path: str, home: str, port: int | None) -> int:
    spec = yaml.safe_load(Path(spec_path).read_text())
    home_dir = Path(home)
    with embedded_stack(home_dir, port) as (base, api_key):
        print(
            f"embedded stack up: API {base} (SQLite, filesystem broker, one local worker) under {home_dir}/"
        )
        job = run_job_over_http(base, api_key, spec, home_dir / "last-job")
    evaluation = {}
    report_path = home_dir / "last-job" / "report.json"
    if report_path.exists():
        evaluation = json.loads(report_path.read_text()).get("evaluation", {})
    print(f"job {job['id']}: {job['status']}")
    if evaluation.get("before") and evaluation.get("after"):
        before, after = evaluation["before"], evaluation["after"]
        print(
            f"held-out avg@k: {before.get('avg_at_k')} before RL (step 0) → {after.get('avg_at_k')} after step {after.get('step')}"
        )
    print(f"report: {home_dir / 'last-job' / 'report.html'}; checkpoints: {len(job.get('checkpoints', []))}")
    return 0 if job["status"] == "succeeded" else 1
