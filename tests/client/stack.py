"""The real service for the client's tests: `python -m service serve` and two `python -m worker run` as
subprocesses over a throwaway PostgreSQL database and the session's Redis (tests/services.py; a queue of the
stack's own), with a tenant and a real API key. The API process can be restarted on the same
port (the event-stream test drops its connection that way), and a second API process with a tight rate
limit can be started beside it (the retry test's real 429s).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from store import migrate, repository
from store.database import Database
from tests import services

REPO_ROOT = Path(__file__).resolve().parents[2]

TINY_SPEC: dict[str, Any] = {
    "model": {"name": "tiny-arith"},
    "task": {"source": "arithmetic", "train_size": 64, "eval_size": 8},
    "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
    "sampling": {"group_size": 4, "max_new_tokens": 5},
    "optim": {"steps": 4, "prompts_per_step": 3, "micro_batch_size": 6},
    "checkpoint": {"interval": 2, "keep_last": 2},
    "evaluation": {"interval": 2},
}


def tiny_spec(steps: int = 4, **overrides: Any) -> dict[str, Any]:
    spec = {k: dict(v) for k, v in TINY_SPEC.items()}
    spec["optim"]["steps"] = steps
    for key, value in overrides.items():
        spec[key] = value
    return spec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Process:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-chars:]
        return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@dataclass
class Stack:
    workdir: Path
    database_url: str
    queue: str
    port: int
    broker_url: str
    api_key: str = ""
    tenant_id: str = ""
    api: Process | None = None
    workers: list[Process] = field(default_factory=list)
    extra: list[Process] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def artifact_root(self) -> Path:
        return self.workdir / "artifacts"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STARE_")}
        env.update(
            {
                "PYTHONPATH": str(REPO_ROOT),
                "PYTHONUNBUFFERED": "1",
                "STARE_ENVIRONMENT": "development",
                "STARE_DATABASE_URL": self.database_url,
                "STARE_BROKER_URL": self.broker_url,
                "STARE_ARTIFACT_ROOT": str(self.artifact_root),
                "STARE_TRAINING_QUEUE": self.queue,
                "STARE_SSE_POLL_INTERVAL_S": "0.2",
                "STARE_SSE_KEEPALIVE_S": "2",
                "STARE_RATE_LIMIT_PER_SECOND": "0",
                "STARE_TENANT_RATE_LIMIT_PER_SECOND": "0",
                "STARE_MAX_ACTIVE_JOBS_PER_TENANT": "0",
                "STARE_MAX_ATTEMPTS": "1",  # a crashed trainer fails its job at once (the exit-code test)
                "STARE_AUTH_CACHE_TTL_S": "0",
                "STARE_HEARTBEAT_S": "1",
                "STARE_STALE_AFTER_S": "10",
                "STARE_SWEEP_INTERVAL_S": "1",
                "STARE_UNCLAIMED_AFTER_S": "3",
            }
        )
        env.update(extra)
        return env

    def _spawn(self, name: str, command: list[str], env: dict[str, str]) -> Process:
        log = self.workdir / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return Process(name, proc, log)

    def start_api(self, port: int | None = None, name: str = "api", **env: str) -> Process:
        port = port or self.port
        command = [sys.executable, "-m", "service", "serve", "--host", "127.0.0.1", "--port", str(port)]
        process = self._spawn(name, command, self.env(**env))
        wait_healthy(f"http://127.0.0.1:{port}", process)
        return process

    def restart_api(self) -> float:
        """Stop the API process and start a new one on the same port; returns the seconds it was away."""
        assert self.api is not None
        began = time.monotonic()
        self.api.stop()
        self.api = self.start_api()
        return time.monotonic() - began

    def start_worker(self, name: str = "worker", sweep: bool = True) -> Process:
        command = [sys.executable, "-m", "worker", "run", *(["--sweep"] if sweep else [])]
        return self._spawn(name, command, self.env())

    @staticmethod
    def wait_ready(process: Process, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while " ready." not in process.tail(100_000):
            if process.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{process.name} did not start:\n{process.tail()}")
            time.sleep(0.2)

    def diagnostics(self) -> str:
        parts = [f"--- {p.name} log:\n{p.tail()}" for p in (self.api, *self.workers, *self.extra) if p]
        return "\n".join(parts)


def wait_healthy(url: str, process: Process, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        if process.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{process.name} did not start at {url}:\n{process.tail()}")
        time.sleep(0.2)


@contextlib.contextmanager
def running_stack(workdir: Path) -> Iterator[Stack]:
    server = services.postgres()
    name = server.create("stare_client_test")
    url = server.url(name)
    stack = Stack(workdir, url, f"client-{uuid.uuid4().hex[:8]}", free_port(), services.redis_url())
    try:
        migrate.upgrade(url)
        stack.artifact_root.mkdir(parents=True, exist_ok=True)
        db = Database(url, pool_size=1)
        try:
            with db.transaction() as session:
                tenant = repository.create_tenant(session, f"client-{uuid.uuid4().hex[:8]}")
                _, secret = repository.create_api_key(session, tenant.id, "client-tests")
                stack.tenant_id, stack.api_key = tenant.id, secret
        finally:
            db.dispose()
        # Two workers, so that two tiny jobs train at once (the suite's time budget); one runs the sweeper.
        stack.workers = [stack.start_worker("worker-1"), stack.start_worker("worker-2", sweep=False)]
        stack.api = stack.start_api()
        for worker in stack.workers:
            stack.wait_ready(worker)
        yield stack
    finally:
        for process in (*stack.extra, stack.api, *stack.workers):
            if process is not None:
                process.stop()
        with contextlib.suppress(Exception):
            server.drop(name)
