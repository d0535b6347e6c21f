"""GET /healthz latency while clients send the worst JSON bodies, authenticated and not (issue 44, R3).

What runs, on loopback: a throwaway PostgreSQL database (created, migrated, dropped at the end); the API
(`python -m service serve`, one uvicorn process, production rate limits) from a source tree, this one by
default or `--source DIR` (say an export of an older commit: `git archive c078183 | tar -x -C DIR`, so the
figures before and after a change are taken on one machine, one after the other); `--clients` attackers in
their own process (bench/event_loop_load.py: half with a valid key each, of a tenant each, half with a wrong
one; each sends 1 MiB hostile bodies one after another to POST /v1/jobs/estimate); and in this process a
probe that times GET /healthz every 20 ms for `--seconds`. Reported: the probe's p50, p99 and max, and the
attackers' answers by status.

    .venv/bin/python bench/bench_event_loop.py [--source DIR] [--clients 8] [--seconds 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _common  # noqa: F401 - the repository root on sys.path

from bench.event_loop_load import percentile, probe

ROOT = Path(__file__).resolve().parents[1]
PG = os.environ.get("STARE_TEST_PG_HOST", "127.0.0.1"), int(os.environ.get("STARE_TEST_PG_PORT", "5432"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def database() -> Iterator[str]:
    """A fresh migrated PostgreSQL database (the service's URL form), dropped on exit."""
    import psycopg
    from psycopg import sql

    from store import migrate

    name = f"stare_bench_loop_{uuid.uuid4().hex[:10]}"
    admin = psycopg.connect(host=PG[0], port=PG[1], dbname="postgres", autocommit=True)
    user = admin.info.user
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = f"postgresql+psycopg://{user}@{PG[0]}:{PG[1]}/{name}"
    try:
        migrate.upgrade(url)
        yield url
    finally:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.close()


def tenant_keys(url: str, count: int) -> list[str]:
    from store import repository
    from store.database import Database

    db = Database(url, pool_size=1)
    keys = []
    try:
        for _ in range(count):
            with db.transaction() as session:
                tenant = repository.create_tenant(session, f"bench-{uuid.uuid4().hex[:10]}")
                keys.append(repository.create_api_key(session, tenant.id, "bench")[1])
    finally:
        db.dispose()
    return keys


@contextlib.contextmanager
def api(source: Path, url: str, artifacts: Path, **settings: str) -> Iterator[int]:
    """`python -m service serve` from `source` on a free port, until the block ends."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(source),
        "OMP_NUM_THREADS": "1",
        "STARE_DATABASE_URL": url,
        "STARE_ARTIFACT_ROOT": str(artifacts),
        "STARE_QUEUE_BACKEND": "record",
        "STARE_TASK_CHECK_PREWARM": "false",
        **settings,
    }
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    cmd = [sys.executable, "-m", "service", "serve", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=source, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError("the API did not start: " + log.read().decode()[-2000:]) from None
                time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(20)
        if proc.poll() is None:
            proc.kill()
        log.close()


def measure(port: int, keys: list[str], unauthenticated: int, seconds: float) -> dict[str, Any]:
    """The probe's latencies while the attackers run (their own process), and the attackers' answers."""
    cmd = [sys.executable, "-m", "bench.event_loop_load", "attack", "--port", str(port)]
    cmd += ["--seconds", str(seconds + 2), "--unauthenticated", str(unauthenticated)]
    for key in keys:
        cmd += ["--key", key]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    attackers = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)  # the attackers are sending
    latencies = asyncio.run(probe(port, seconds))
    out, _ = attackers.communicate(timeout=seconds + 120)
    ms = [1000 * value for value in latencies]
    return {
        "healthz_ms": {
            "count": len(ms),
            "p50": round(percentile(ms, 0.50), 2),
            "p99": round(percentile(ms, 0.99), 2),
            "max": round(max(ms), 2),
        },
        "answers": json.loads(out.strip().splitlines()[-1]) if out.strip() else {},
    }


def run(source: Path, clients: int, seconds: float) -> dict[str, Any]:
    authenticated = clients // 2
    with database() as url, tempfile.TemporaryDirectory() as artifacts:
        keys = tenant_keys(url, authenticated)
        with api(source, url, Path(artifacts)) as port:
            idle = asyncio.run(probe(port, min(3.0, seconds)))
            loaded = measure(port, keys, clients - authenticated, seconds)
    return {
        "source": str(source),
        "clients": {"authenticated": authenticated, "unauthenticated": clients - authenticated},
        "idle_healthz_ms_p99": round(1000 * percentile(idle, 0.99), 2),
        **loaded,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=ROOT, help="the source tree the API runs from")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--smoke", action="store_true", help="2 clients, 3 s")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    clients, seconds = (2, 3.0) if args.smoke else (args.clients, args.seconds)
    result = run(args.source.resolve(), clients, seconds)
    result["machine"] = {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load": os.getloadavg(),
    }
    result["smoke"] = args.smoke
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
