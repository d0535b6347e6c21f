"""The reliability suite's harness: the HTTP API (TestClient, Celery enqueueing on the suite's Redis), real
`python -m worker run` subprocesses, and bounded waits that fail with the job, its events, and the worker and
trainer logs.

Each test gets its own training queue, so a test's workers never see another test's messages.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
import sqlalchemy as sa
import sqlalchemy.exc
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from store import repository
from store.database import Database
from store.models import TERMINAL_STATUSES, Checkpoint, Job, JobMetric
from tests.servers import PrivatePostgres, PrivateRedis

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_SCALE = float(os.environ.get("STARE_TEST_TIMEOUT_SCALE", "1"))
TRANSIENT = (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)

# Worker timings for the suite (seconds): heartbeat 1, stale after 4 (the sweeper's "worker lost"),
# sweep every 1, re-ring a queued job's doorbell after 3.
HEARTBEAT_S = 1.0
STALE_AFTER_S = 4.0
SWEEP_INTERVAL_S = 1.0
UNCLAIMED_AFTER_S = 3.0

# Figures the tests measure, printed at the end of the run (and written as JSON to
# $STARE_RELIABILITY_JSON when set); docs/RELIABILITY.md records them.
FIGURES: dict[str, dict[str, Any]] = {}


def record_figures(test: str, **values: Any) -> None:
    FIGURES.setdefault(test, {}).update(values)


STEP_DELAY_S = 0.25


def tiny_spec(steps: int, interval: int = 2, **extra: Any) -> dict[str, Any]:
    """The tiny built-in model on arithmetic: each step takes well under a second on a CPU core."""
    spec: dict[str, Any] = {
        "model": {"name": "tiny-arith"},
        "task": {"source": "arithmetic", "train_size": 64, "eval_size": 8},
        "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
        "sampling": {"group_size": 4, "max_new_tokens": 5},
        "optim": {"steps": steps, "prompts_per_step": 3, "micro_batch_size": 6},
        "checkpoint": {"interval": interval},
    }
    spec.update(extra)
    return spec


@dataclass
class Infra:
    """The servers of the session: private ones when this machine allows it (see conftest.py)."""

    database_url: str
    broker_url: str
    artifact_root: Path
    db: Database
    redis: PrivateRedis | None
    postgres: PrivatePostgres | None
    notes: list[str] = field(default_factory=list)
    quick: bool = False  # while collecting diagnostics: do not wait long for a database that is down

    def db_retry(self, fn: Callable[[Any], T], timeout: float = 90.0) -> T:
        """fn(session) in a transaction, retried while the database is away (tests 3 and 4 restart it)."""
        if self.quick:
            timeout = 2.0
        deadline = time.monotonic() + timeout * TIMEOUT_SCALE
        while True:
            try:
                with self.db.transaction() as session:
                    return fn(session)
            except TRANSIENT:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)


class WorkerProcess:
    """One `python -m worker run [--sweep]` subprocess, its log, and its trainer children."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                command,
                env=env,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid = self.proc.pid

    def log(self, tail: int | None = None) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-tail:] if tail else text

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout * TIMEOUT_SCALE
        while " ready." not in self.log():
            if not self.alive():
                pytest.fail(f"worker {self.name} exited with {self.proc.returncode}:\n{self.log(4000)}")
            if time.monotonic() > deadline:
                pytest.fail(f"worker {self.name} not ready after {timeout} s:\n{self.log(4000)}")
            time.sleep(0.1)

    def trainers(self) -> list[psutil.Process]:
        """The trainer children (`python -m trainer run ...`) of this worker (not the bwrap that confines
        each: its command line holds the trainer's, worker/isolation.py)."""
        found = []
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    cmd = child.cmdline()
                    if "trainer" in cmd and "run" in cmd and child.name() != "bwrap":
                        found.append(child)
        return found

    def kill9(self) -> list[psutil.Process]:
        """SIGKILL the worker process alone (not its trainer); returns the trainers it had."""
        trainers = self.trainers()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        return trainers

    def shutdown(self) -> None:
        """Test teardown: SIGKILL the worker and everything under it."""
        children: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            children = psutil.Process(self.pid).children(recursive=True)
        if self.alive():
            self.proc.kill()
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        psutil.wait_procs(children, timeout=30)


class Harness:
    """One test's API client, tenant, queue and workers."""

    def __init__(self, infra: Infra, name: str, tmp_path: Path, *, max_attempts: int = 3) -> None:
        self.infra = infra
        self.name = name
        self.tmp_path = tmp_path
        self.queue = f"training-{uuid.uuid4().hex[:8]}"
        self.settings = Settings(
            environment="development",
            database_url=infra.database_url,
            database_pool_size=4,
            artifact_root=infra.artifact_root,
            queue_backend="celery",
            broker_url=infra.broker_url,
            training_queue=self.queue,
            rate_limit_per_second=0.0,
            tenant_rate_limit_per_second=0.0,
            max_active_jobs_per_tenant=0,
            max_attempts=max_attempts,
            auth_cache_ttl_s=60.0,
        )
        self.client = TestClient(create_app(self.settings), raise_server_exceptions=False)
        self.client.__enter__()

        def make_tenant(session: Any) -> tuple[str, str]:
            tenant = repository.create_tenant(session, f"w-{uuid.uuid4().hex[:12]}")
            _, secret = repository.create_api_key(session, tenant.id, "reliability")
            return tenant.id, secret

        self.tenant_id, secret = infra.db_retry(make_tenant)
        self.headers = {"Authorization": f"Bearer {secret}"}
        self.workers: list[WorkerProcess] = []
        self.jobs: list[str] = []
        self._run_dirs: dict[str, Path] = {}

    # ------------------------------------------------------------------------------------------ workers

    def worker_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STARE_")}
        env.update(
            {
                "PYTHONPATH": str(REPO_ROOT),
                "PYTHONUNBUFFERED": "1",
                "STARE_ENVIRONMENT": "development",
                "STARE_DATABASE_URL": self.infra.database_url,
                "STARE_BROKER_URL": self.infra.broker_url,
                "STARE_ARTIFACT_ROOT": str(self.infra.artifact_root),
                "STARE_TRAINING_QUEUE": self.queue,
                "STARE_HEARTBEAT_S": str(HEARTBEAT_S),
                "STARE_STALE_AFTER_S": str(STALE_AFTER_S),
                "STARE_SWEEP_INTERVAL_S": str(SWEEP_INTERVAL_S),
                "STARE_UNCLAIMED_AFTER_S": str(UNCLAIMED_AFTER_S),
                # Steps of a fixed minimum length: the tests' kills, pauses and outages land mid-run however
                # fast the machine trains the tiny model.
                "STARE_STEP_DELAY_S": str(STEP_DELAY_S),
                "STARE_LEASE_S": "30",
                "STARE_DB_RETRY_MAX_S": "120",
                "STARE_CANCEL_GRACE_S": "60",
            }
        )
        env.update(extra or {})
        return env

    def start_worker(
        self, *, sweep: bool = True, env: dict[str, str] | None = None, wait_ready: bool = True
    ) -> WorkerProcess:
        index = len(self.workers) + 1
        command = [sys.executable, "-m", "worker", "run"] + (["--sweep"] if sweep else [])
        worker = WorkerProcess(
            f"w{index}", command, self.worker_env(env), self.tmp_path / f"worker-{index}.log"
        )
        self.workers.append(worker)
        if wait_ready:
            worker.wait_ready()
        return worker

    def send_duplicate(self, job_id: str) -> None:
        """Ring the job's doorbell once more, as a second Celery message (the worker's task, by name)."""
        import celery

        app = celery.Celery("reliability-test", broker=self.infra.broker_url, set_as_current=False)
        try:
            app.send_task(self.settings.train_task_name, args=[job_id], queue=self.queue)
        finally:
            app.close()

    # ---------------------------------------------------------------------------------------------- API

    def api(self, method: str, path: str, *, retry_s: float = 60.0, **kwargs: Any) -> Any:
        """An HTTP call; GETs are retried on 5xx (the API answers 503 while its database restarts)."""
        deadline = time.monotonic() + (2.0 if self.infra.quick else retry_s) * TIMEOUT_SCALE
        while True:
            response = self.client.request(method, path, headers=self.headers, **kwargs)
            if response.status_code < 500 or method != "GET" or time.monotonic() > deadline:
                return response
            time.sleep(0.3)

    def post_job(self, spec: dict[str, Any]) -> str:
        response = self.api("POST", "/v1/jobs", json={"spec": spec})
        assert response.status_code == 201, response.text
        job_id = str(response.json()["id"])
        self.jobs.append(job_id)
        return job_id

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.api("GET", f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def events(self, job_id: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        after = 0
        while True:
            response = self.api("GET", f"/v1/jobs/{job_id}/events", params={"after": after, "limit": 1000})
            assert response.status_code == 200, response.text
            page = response.json()
            found.extend(page["data"])
            if not page["has_more"]:
                return found
            after = page["last_id"]

    def metrics(self, job_id: str) -> list[dict[str, Any]]:
        """GET /v1/jobs/{id}/metrics: [{"step": k, "values": {...}}] oldest first."""
        response = self.api("GET", f"/v1/jobs/{job_id}/metrics", params={"limit": 100_000})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["has_more"] is False
        return list(body["data"])

    def checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        response = self.api("GET", f"/v1/jobs/{job_id}/checkpoints")
        assert response.status_code == 200, response.text
        return list(response.json()["data"])

    # ----------------------------------------------------------------------------------------- database

    def job_row(self, job_id: str) -> dict[str, Any]:
        def read(session: Any) -> dict[str, Any]:
            job = session.get(Job, job_id, populate_existing=True)
            assert job is not None
            return {
                "status": job.status,
                "attempt": job.attempt,
                "failures": job.failures,
                "lost_workers": job.lost_workers,
                "crash_streak": job.crash_streak,
                "current_step": job.current_step,
                "run_dir": job.run_dir,
                "lease_owner": job.lease_owner,
                "heartbeat_at": job.heartbeat_at,
            }

        return self.infra.db_retry(read)

    def metric_rows(self, job_id: str) -> list[tuple[int, int, dict[str, Any]]]:
        """(step, attempt, metrics) of every metric row of the job, by step."""

        def read(session: Any) -> list[tuple[int, int, dict[str, Any]]]:
            rows = session.execute(
                sa.select(JobMetric.step, JobMetric.attempt, JobMetric.metrics)
                .where(JobMetric.job_id == job_id)
                .order_by(JobMetric.step)
            ).all()
            return [(int(r.step), int(r.attempt), dict(r.metrics)) for r in rows]

        return self.infra.db_retry(read)

    def checkpoint_rows(self, job_id: str) -> list[tuple[int, str, int | None]]:
        """(step, path relative to the artifact root, bytes) of every checkpoint row of the job, by step."""

        def read(session: Any) -> list[tuple[int, str, int | None]]:
            rows = session.execute(
                sa.select(Checkpoint.step, Checkpoint.path, Checkpoint.bytes)
                .where(Checkpoint.job_id == job_id)
                .order_by(Checkpoint.step)
            ).all()
            return [(int(r.step), str(r.path), r.bytes) for r in rows]

        return self.infra.db_retry(read)

    def max_step(self, job_id: str) -> int:
        rows = self.metric_rows(job_id)
        return max((step for step, _, _ in rows), default=0)

    # ------------------------------------------------------------------------------------------- files

    def run_dir(self, job_id: str) -> Path:
        if job_id not in self._run_dirs:  # cached: tests read the trainer's files while the database is down
            self._run_dirs[job_id] = self.infra.artifact_root / str(self.job_row(job_id)["run_dir"])
        return self._run_dirs[job_id]

    def trainer_logs(self, job_id: str) -> dict[str, str]:
        folder = self.run_dir(job_id)
        return {p.name: p.read_text(errors="replace") for p in sorted(folder.glob("trainer-attempt-*.log"))}

    def trainer_events(self, job_id: str) -> list[dict[str, Any]]:
        """The trainer's own events.jsonl in the run folder (its view, independent of the database)."""
        path = self.run_dir(job_id) / "events.jsonl"
        events = []
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                events.append(json.loads(line))
        return events

    # ------------------------------------------------------------------------------------------- waits

    def diagnostics(self, job_id: str | None = None) -> str:
        self.infra.quick = True
        try:
            return self._diagnostics(job_id)
        finally:
            self.infra.quick = False

    def _diagnostics(self, job_id: str | None) -> str:
        parts: list[str] = []
        jobs = [job_id] if job_id else self.jobs
        for jid in jobs:
            with contextlib.suppress(Exception):
                row = self.job_row(jid)
                parts.append(f"--- job {jid}: {row}")
            with contextlib.suppress(Exception):
                job = self.job(jid)
                parts.append(f"error: {job.get('error')}")
            with contextlib.suppress(Exception):
                events = self.events(jid)
                parts.append(
                    "events:\n"
                    + "\n".join(
                        f"  {e['id']} {e['created_at']} {e['type']}: {e['message']}" for e in events[-40:]
                    )
                )
            with contextlib.suppress(Exception):
                steps = [(s, a) for s, a, _ in self.metric_rows(jid)]
                parts.append(f"metric rows (step, attempt): {steps}")
            with contextlib.suppress(Exception):
                for name, text in self.trainer_logs(jid).items():
                    parts.append(f"--- trainer log {name} (tail):\n{text[-2500:]}")
        for worker in self.workers:
            state = "alive" if worker.alive() else f"exited {worker.proc.returncode}"
            parts.append(f"--- worker {worker.name} pid {worker.pid} ({state}) log tail:\n{worker.log(3000)}")
        return "\n".join(parts)

    def wait_for(
        self, what: str, probe: Callable[[], T | None], timeout: float, *, job_id: str | None = None
    ) -> T:
        """Poll probe() until it returns something truthy; on timeout fail with the diagnostics."""
        deadline = time.monotonic() + timeout * TIMEOUT_SCALE
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout} s waiting for {what}\n{self.diagnostics(job_id)}")
            time.sleep(0.2)

    def wait_status(
        self, job_id: str, statuses: str | tuple[str, ...], timeout: float = 180.0
    ) -> dict[str, Any]:
        wanted = (statuses,) if isinstance(statuses, str) else statuses

        def probe() -> dict[str, Any] | None:
            row = self.job_row(job_id)
            if row["status"] in wanted:
                return row
            if row["status"] in TERMINAL_STATUSES:
                pytest.fail(
                    f"job {job_id} ended {row['status']} while waiting for {wanted}\n{self.diagnostics(job_id)}"
                )
            return None

        return self.wait_for(f"job {job_id} to be {'/'.join(wanted)}", probe, timeout, job_id=job_id)

    def wait_step(self, job_id: str, step: int, timeout: float = 120.0) -> int:
        """Until a metric row of `step` (or later) exists; returns the highest step recorded."""

        def probe() -> int | None:
            top = self.max_step(job_id)
            if top >= step:
                return top
            status = self.job_row(job_id)["status"]
            if status in TERMINAL_STATUSES:
                pytest.fail(f"job {job_id} ended {status} before step {step}\n{self.diagnostics(job_id)}")
            return None

        return self.wait_for(f"job {job_id} to reach step {step}", probe, timeout, job_id=job_id)

    def wait_trainer(self, worker: WorkerProcess, timeout: float = 60.0) -> psutil.Process:
        return self.wait_for(
            f"a trainer under worker {worker.name}",
            lambda: (worker.trainers() or [None])[0],
            timeout,
        )

    # ----------------------------------------------------------------------------------------- teardown

    def close(self) -> None:
        for worker in self.workers:
            worker.shutdown()

        def settle(session: Any) -> None:  # leave nothing for a later test's sweeper to re-send
            session.execute(
                sa.update(Job)
                .where(Job.queue == self.queue, Job.status.not_in(tuple(TERMINAL_STATUSES)))
                .values(status="cancelled", lease_token=None)
            )

        with contextlib.suppress(Exception):
            self.infra.db_retry(settle, timeout=30)
        self.client.__exit__(None, None, None)


@contextlib.contextmanager
def harness_for(infra: Infra, name: str, tmp_path: Path, **kwargs: Any) -> Iterator[Harness]:
    harness = Harness(infra, name, tmp_path, **kwargs)
    try:
        yield harness
    finally:
        harness.close()


def assert_steps_exactly_once(rows: list[tuple[int, int, dict[str, Any]]], total: int, context: str) -> None:
    steps = [step for step, _, _ in rows]
    assert steps == list(range(1, total + 1)), (
        f"metric rows must be steps 1..{total} exactly once; got {steps}\n{context}"
    )


def event_time(event: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(event["created_at"].replace("Z", "+00:00")).timestamp()
