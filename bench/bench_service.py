"""Throughput and latency of the HTTP service under concurrent load (issue 4).

What runs, all on loopback:
- PostgreSQL: a throwaway database on the machine's server (created, migrated, dropped at the end).
- Redis: the machine's server; POST /v1/jobs really enqueues (Celery send_task) on a bench-only queue that
  is deleted at the end.
- Two uvicorn processes, one worker each, no access log (httptools and uvloop, as `uvicorn[standard]`
  installs them): the service (`create_app`) and a bare FastAPI app whose one endpoint returns a constant.
  The bare app is the floor the service is compared with.
- The load comes from a second process (this file with `load`): an asyncio HTTP/1.1 client with keep-alive
  connections, C concurrent connections each sending its next request as soon as the previous answer is
  complete (closed loop), bounded by both a request count and a duration.

Rows, in one run, interleaved over --rounds rounds (each row takes its best round, to damp the noise of a
shared 2-core machine): bare GET /bare, GET /v1/jobs/{id} (authenticated; cycles over 32 jobs), POST
/v1/jobs (authenticated; validates the spec, inserts the job and its first event, commits, enqueues).
Besides requests/s and latency, each row reports the server process's CPU time per request (from /proc),
which is less sensitive than throughput to whatever else the machine is running.

    .venv/bin/python bench/bench_service.py [--concurrency 64] [--duration 6] [--max-requests 30000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

SPEC = {
    "name": "bench",
    "model": {"name": "tiny-arith"},
    "task": {"source": "arithmetic", "params": {"operations": ["+"], "min_operand": 0, "max_operand": 99}},
    "algorithm": {"name": "stare"},
    "optim": {"steps": 100},
}


# ------------------------------------------------------------------------------------------ load generator


def _request(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: keep-alive"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return status


async def _connection(
    port: int,
    requests: list[bytes],
    deadline: float,
    budget: list[int],
    latencies: list[float],
    errors: list[int],
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    i = 0
    try:
        while budget[0] > 0 and time.perf_counter() < deadline:
            budget[0] -= 1
            payload = requests[i % len(requests)]
            i += 1
            start = time.perf_counter()
            writer.write(payload)
            status = await _read_response(reader)
            latencies.append(time.perf_counter() - start)
            if status >= 400:
                errors.append(status)
    finally:
        writer.close()


async def _run_load(
    port: int, requests: list[bytes], concurrency: int, duration: float, max_requests: int
) -> dict[str, Any]:
    # Warm-up: one request per connection's worth, not timed.
    warm: list[float] = []  # not timed
    await asyncio.gather(
        *(
            _connection(port, requests, time.perf_counter() + 2, [min(concurrency * 4, 400)], warm, [])
            for _ in range(8)
        )
    )
    latencies: list[float] = []
    errors: list[int] = []
    budget = [max_requests]
    start = time.perf_counter()
    deadline = start + duration
    await asyncio.gather(
        *(_connection(port, requests, deadline, budget, latencies, errors) for _ in range(concurrency))
    )
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "requests": len(latencies),
        "seconds": elapsed,
        "rps": len(latencies) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "warmup_requests": len(warm),
        "errors": len(errors),
        "error_statuses": sorted(set(errors))[:5],
    }


def load_main(args: argparse.Namespace) -> None:
    spec = json.loads(Path(args.plan).read_text())
    requests = [
        _request(r["method"], r["path"], r["headers"], r.get("body", "").encode()) for r in spec["requests"]
    ]
    result = asyncio.run(
        _run_load(spec["port"], requests, args.concurrency, args.duration, args.max_requests)
    )
    print(json.dumps(result))


# -------------------------------------------------------------------------------------------- orchestration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(port: int, path: str, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(_request("GET", path, {}))
            if s.recv(64).startswith(b"HTTP/1.1 200"):
                return
        time.sleep(0.2)
    raise RuntimeError(f"server on port {port} did not become ready")


@contextlib.contextmanager
def _server(
    factory: str, port: int, env: dict[str, str], ready_path: str
) -> Iterator[subprocess.Popen[bytes]]:
    cmd = [
        sys.executable, "-m", "uvicorn", "--factory", factory, "--host", "127.0.0.1", "--port", str(port),
        "--workers", "1", "--no-access-log", "--log-level", "warning", "--backlog", "2048",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env)
    try:
        _wait_ready(port, ready_path)
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def bare_app() -> Any:
    """The floor: FastAPI with one endpoint that returns a constant (no middleware, no database)."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/bare")
    def bare() -> dict[str, str]:
        return {"status": "ok"}

    return app


def service_app() -> Any:
    from service.app import create_app

    return create_app()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (from /proc), to report the server's cost per request."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load(plan: dict[str, Any], args: argparse.Namespace, server_pid: int) -> dict[str, Any]:
    before = _cpu_seconds(server_pid)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(plan, fh)
    try:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "load",
                "--plan",
                fh.name,
                "--concurrency",
                str(args.concurrency),
                "--duration",
                str(args.duration),
                "--max-requests",
                str(args.max_requests),
            ],
            capture_output=True,
            text=True,
            timeout=args.duration + 120,
            check=True,
        )
    finally:
        os.unlink(fh.name)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    served = result["requests"] + result["warmup_requests"]
    result["server_cpu_ms_per_request"] = 1000 * (_cpu_seconds(server_pid) - before) / max(served, 1)
    result["load_average_1m"] = os.getloadavg()[0]
    return result


def _setup_database() -> tuple[str, str, Any]:
    import psycopg
    from psycopg import sql

    from service import migrate

    name = f"stare_svc_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = None
    for user in (None, "postgres"):
        try:
            admin = psycopg.connect(host="127.0.0.1", dbname="postgres", user=user, autocommit=True)
            break
        except psycopg.OperationalError:
            continue
    if admin is None:
        raise RuntimeError("cannot reach PostgreSQL on 127.0.0.1:5432")
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = f"postgresql+psycopg://{admin.info.user}@127.0.0.1:5432/{name}"
    migrate.upgrade(url)
    return name, url, admin


def main_bench(args: argparse.Namespace) -> None:
    import redis
    from psycopg import sql

    from service import repository
    from service.database import Database

    name, url, admin = _setup_database()
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    artifacts = tempfile.mkdtemp(prefix="stare-bench-")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "STARE_DATABASE_URL": url,
        "STARE_BROKER_URL": args.redis_url,
        "STARE_TRAINING_QUEUE": queue,
        "STARE_ARTIFACT_ROOT": artifacts,
        "STARE_RATE_LIMIT_PER_SECOND": "0",
        "STARE_MAX_ACTIVE_JOBS_PER_TENANT": "0",
        "STARE_DATABASE_POOL_SIZE": "20",
    }
    results: dict[str, list[dict[str, Any]]] = {
        "bare GET /bare": [],
        "GET /v1/jobs/{id}": [],
        "POST /v1/jobs": [],
    }
    try:
        db = Database(url, pool_size=1)
        with db.transaction() as session:
            tenant = repository.create_tenant(session, "bench")
            _, key = repository.create_api_key(session, tenant.id, "bench")
        db.dispose()
        auth = {"Authorization": f"Bearer {key}"}
        bare_port, service_port = _free_port(), _free_port()
        with (
            _server("bench.bench_service:bare_app", bare_port, env, "/bare") as bare_server,
            _server("bench.bench_service:service_app", service_port, env, "/healthz") as service_server,
        ):
            pids = {bare_port: bare_server.pid, service_port: service_server.pid}
            import httpx

            with httpx.Client(base_url=f"http://127.0.0.1:{service_port}", headers=auth) as client:
                job_ids = [
                    client.post("/v1/jobs", json={"spec": SPEC}).raise_for_status().json()["id"]
                    for _ in range(32)
                ]
            post_body = json.dumps({"spec": SPEC})
            plans = {
                "bare GET /bare": {
                    "port": bare_port,
                    "requests": [{"method": "GET", "path": "/bare", "headers": {}}],
                },
                "GET /v1/jobs/{id}": {
                    "port": service_port,
                    "requests": [
                        {"method": "GET", "path": f"/v1/jobs/{j}", "headers": auth} for j in job_ids
                    ],
                },
                "POST /v1/jobs": {
                    "port": service_port,
                    "requests": [
                        {
                            "method": "POST",
                            "path": "/v1/jobs",
                            "headers": {**auth, "Content-Type": "application/json"},
                            "body": post_body,
                        }
                    ],
                },
            }
            for round_index in range(args.rounds):
                for row, plan in plans.items():
                    result = _load(plan, args, pids[plan["port"]])
                    results[row].append(result)
                    print(f"round {round_index + 1} {row}: {json.dumps(result)}", file=sys.stderr)
    finally:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.close()
        broker = redis.Redis.from_url(args.redis_url)
        broker.delete(queue)
        for binding in broker.scan_iter("_kombu.binding.*"):
            for member in broker.smembers(binding):
                if queue.encode() in member:
                    broker.srem(binding, member)

    best = {row: max(runs, key=lambda r: r["rps"]) for row, runs in results.items()}
    bare = best["bare GET /bare"]["rps"]
    print(f"\nService benchmark: {args.concurrency} concurrent connections, best of {args.rounds} rounds")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(
        "load average (1 min) after each row: "
        + ", ".join(f"{r['load_average_1m']:.1f}" for r in best.values())
    )
    print(
        f"{'row':<22}{'req/s':>9}{'vs bare':>9}{'p50 ms':>9}{'p99 ms':>9}{'cpu ms/req':>12}{'requests':>10}"
        f"{'errors':>8}"
    )
    for row, r in best.items():
        print(
            f"{row:<22}{r['rps']:>9.0f}{r['rps'] / bare:>9.1%}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
            f"{r['server_cpu_ms_per_request']:>12.2f}{r['requests']:>10}{r['errors']:>8}"
        )
    get, post = best["GET /v1/jobs/{id}"], best["POST /v1/jobs"]
    print("\ntargets: GET ≥ 40 % of bare and p99 ≤ 50 ms; POST p99 ≤ 100 ms")
    print(
        f"GET {get['rps'] / bare:.1%} of bare ({'met' if get['rps'] >= 0.4 * bare else 'NOT met'}), "
        f"GET p99 {get['p99_ms']:.1f} ms ({'met' if get['p99_ms'] <= 50 else 'NOT met'}), "
        f"POST p99 {post['p99_ms']:.1f} ms ({'met' if post['p99_ms'] <= 100 else 'NOT met'})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"best": best, "rounds": results}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command")
    load = sub.add_parser("load", help="(internal) the load generator process")
    load.add_argument("--plan", required=True)
    for p in (parser, load):
        p.add_argument("--concurrency", type=int, default=64)
        p.add_argument("--duration", type=float, default=6.0, help="seconds per row and round")
        p.add_argument("--max-requests", type=int, default=30_000, help="per row and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.command == "load":
        load_main(args)
    else:
        main_bench(args)


if __name__ == "__main__":
    main()
