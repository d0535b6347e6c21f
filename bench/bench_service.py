"""Throughput and latency of the HTTP service under concurrent load (issue 4).

What runs, all on loopback:
- PostgreSQL: a throwaway database on the machine's server (created, migrated, dropped at the end).
- Redis: the machine's server; POST /v1/jobs really enqueues (Celery send_task) on a bench-only queue that
  is deleted at the end.
- Two uvicorn processes, one worker each, no access log (httptools and uvloop, as `uvicorn[standard]`
  installs them): the service (`create_app`) and a bare FastAPI app whose one endpoint returns a constant.
  The bare app is the floor the service is compared with.
- The load comes from a second process (this file with `load`): an asyncio HTTP/1.1 client with C keep-alive
  connections, in two modes.
  - Closed loop (saturation): each connection sends its next request as soon as the previous answer is
    complete, bounded by a request count and a duration. This measures throughput; latency here is mostly
    queueing (Little's law: mean latency = C / throughput).
  - Open loop (rate-bounded, as wrk2 and latency SLOs do it): the C connections carry a constant offered
    rate R for a duration; request i is scheduled in advance at start + i / R and goes out on the next free
    connection. Latency is measured from the *scheduled* send time, so time spent waiting for a connection
    or behind a slow server counts (no coordinated omission). Requests still unsent `--grace` s after the
    schedule ends are dropped and counted with the time they had already waited (a lower bound). Besides
    p50/p99/max and the achieved rate it reports `lag p99`, how late the generator itself sent (its own
    timer and scheduling delay; it is part of the measured latency).

Rows, in one run, interleaved over --rounds rounds: bare GET /bare, GET /v1/jobs/{id} (authenticated; cycles
over 32 jobs), POST /v1/jobs (authenticated; validates the spec, inserts the job and its first event,
commits, enqueues). Each round runs the closed-loop rows, then the open-loop sweep rate by rate (every row at
one rate before the next rate); a row that falls behind at one rate skips the higher ones that round. The
sweep ends with "GET at 40 % of bare": GET at 0.4 × the bare row's closed-loop throughput of that round (can
the service serve the throughput the target asks for within the p99 target?). Closed-loop rows keep their
best round by req/s, open-loop rows their best round by p99 and also show the worst round's p99 (the
machine is shared; other load only adds latency). Besides latency, each row reports the server process's CPU
time per request (from /proc), which is less sensitive than throughput to whatever else the machine runs;
at low open-loop rates it includes the idle server's fixed per-second work.

--workers N runs both servers (service and bare app) with N uvicorn worker processes, so the ratio stays a
like-for-like comparison; --rate-limiter redis turns the service's rate limiter on with a limit never
reached, so every request pays for its bucket (a Redis round trip): the setup several API processes need.
By default the limiter is off, as it was for every earlier figure.

Verdicts: the GET throughput ratio reads the closed loop; the p99 targets are printed for both readings,
saturated (closed loop) and rate-bounded at --common-rate (default 200/s, a rate below every row's
saturation point, so the rows are compared at one offered load), and for each row the highest swept rate at
which its p99 target held.

    .venv/bin/python bench/bench_service.py [--concurrency 64] [--rounds 2] [--mode both|closed|open]
        [--duration 6] [--max-requests 30000] [--rates 100,200,400,800,1600,3200] [--open-duration 5]
        [--common-rate 200] [--grace 3] [--workers 1] [--rate-limiter off|memory|redis] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
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

# As a package module: uvicorn imports this file as bench.bench_service (cwd = the repository root).
from bench import _common  # noqa: E402
from bench.service_load import load_main, request_bytes  # noqa: E402
from bench.service_report import (  # noqa: E402
    BARE,
    GET,
    GET_AT_40,
    POST,
    print_verdicts,
    report_closed,
    report_open,
    saturated,
)

SPEC = {
    "name": "bench",
    "model": {"name": "tiny-arith"},
    "task": {"source": "arithmetic", "params": {"operations": ["+"], "min_operand": 0, "max_operand": 99}},
    "algorithm": {"name": "stare"},
    "optim": {"steps": 100},
}


# -------------------------------------------------------------------------------------------- orchestration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(port: int, path: str, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(request_bytes("GET", path, {}))
            if s.recv(64).startswith(b"HTTP/1.1 200"):
                return
        time.sleep(0.2)
    raise RuntimeError(f"server on port {port} did not become ready")


@contextlib.contextmanager
def _server(
    factory: str, port: int, env: dict[str, str], ready_path: str, workers: int = 1
) -> Iterator[subprocess.Popen[bytes]]:
    cmd = [
        sys.executable, "-m", "uvicorn", "--factory", factory, "--host", "127.0.0.1", "--port", str(port),
        "--workers", str(workers), "--no-access-log", "--log-level", "warning", "--backlog", "2048",
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
    """User + system CPU time of a server (from /proc): the process and its live children (uvicorn's worker
    processes when --service-workers > 1), to report the server's cost per request."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{pid}/task/{pid}/children")
    for child in children.read_text().split() if children.exists() else []:
        with contextlib.suppress(OSError):
            total += _cpu_seconds(int(child))
    return total


def _load(
    plan: dict[str, Any], args: argparse.Namespace, server_pid: int, rate: float = 0.0
) -> dict[str, Any]:
    """One row in the load process: closed loop when rate is 0, else open loop at `rate` requests/s."""
    before = _cpu_seconds(server_pid)
    duration = args.open_duration if rate > 0 else args.duration
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
                str(duration),
                "--max-requests",
                str(args.max_requests),
                "--rate",
                str(rate),
                "--grace",
                str(args.grace),
            ],
            capture_output=True,
            text=True,
            timeout=duration + args.grace + 120,
        )
    finally:
        os.unlink(fh.name)
    if out.returncode != 0:
        raise RuntimeError(f"the load process failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    served = result["requests"] + result["warmup_requests"]
    result["server_cpu_ms_per_request"] = 1000 * (_cpu_seconds(server_pid) - before) / max(served, 1)
    result["load_average_1m"] = os.getloadavg()[0]
    return result


def _setup_database(admin_url: str) -> tuple[str, str, Any]:
    from store import migrate

    name, url, admin = _common.create_database(admin_url, "stare_svc_bench")
    migrate.upgrade(url)
    return name, url, admin


def _run_rounds(
    args: argparse.Namespace, plans: dict[str, dict[str, Any]], pids: dict[int, int]
) -> tuple[dict[str, list[dict[str, Any]]], dict[tuple[str, float], list[dict[str, Any]]]]:
    """Every row interleaved in each round: closed loop (saturation) rows first, then the open-loop sweep,
    rate by rate (all rows at one rate before the next). A row that fell behind at one rate skips the higher
    rates of that round (they only add queueing)."""
    closed: dict[str, list[dict[str, Any]]] = {row: [] for row in plans}
    opened: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for round_index in range(args.rounds):
        if args.mode in ("both", "closed"):
            for row, plan in plans.items():
                result = _load(plan, args, pids[plan["port"]])
                closed[row].append(result)
                print(f"round {round_index + 1} closed {row}: {json.dumps(result)}", file=sys.stderr)
        if args.mode not in ("both", "open"):
            continue
        behind: set[str] = set()
        steps: list[tuple[str, float, float]] = [(row, rate, rate) for rate in args.rates for row in plans]
        if closed[BARE]:  # keyed as rate 0: its offered rate differs a little from round to round
            steps.append((GET_AT_40, 0.0, round(0.4 * closed[BARE][-1]["rps"])))
        for row, key, rate in steps:
            if row in behind:
                continue
            plan = plans[GET if row == GET_AT_40 else row]
            result = _load(plan, args, pids[plan["port"]], rate=rate)
            opened.setdefault((row, key), []).append(result)
            print(f"round {round_index + 1} open {rate:g}/s {row}: {json.dumps(result)}", file=sys.stderr)
            if saturated(result):
                behind.add(row)
    return closed, opened


def _service_env(args: argparse.Namespace, url: str, queue: str, artifacts: str) -> dict[str, str]:
    """The servers' environment: the throwaway database, the bench queue, the rate limiter as --rate-limiter
    asks (a limit never reached when on)."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "STARE_DATABASE_URL": url,
        "STARE_BROKER_URL": args.redis_url,
        "STARE_TRAINING_QUEUE": queue,
        "STARE_ARTIFACT_ROOT": artifacts,
        "STARE_RATE_LIMIT_PER_SECOND": "0" if args.rate_limiter == "off" else "1000000000",
        "STARE_RATE_LIMIT_BURST": "1000000000",
        "STARE_TENANT_RATE_LIMIT_PER_SECOND": "0" if args.rate_limiter == "off" else "1000000000",
        "STARE_TENANT_RATE_LIMIT_BURST": "1000000000",
        "STARE_RATE_LIMIT_BACKEND": "redis" if args.rate_limiter == "redis" else "memory",
        "STARE_RATE_LIMIT_REDIS_URL": args.redis_url,
        "STARE_MAX_ACTIVE_JOBS_PER_TENANT": "0",
        "STARE_DATABASE_POOL_SIZE": "20",
    }


def _plans(
    bare_port: int, service_port: int, auth: dict[str, str], job_ids: list[str]
) -> dict[str, dict[str, Any]]:
    """Each row's port and requests (the load process cycles over them)."""
    post_body = json.dumps({"spec": SPEC})
    return {
        BARE: {"port": bare_port, "requests": [{"method": "GET", "path": "/bare", "headers": {}}]},
        GET: {
            "port": service_port,
            "requests": [{"method": "GET", "path": f"/v1/jobs/{j}", "headers": auth} for j in job_ids],
        },
        POST: {
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


def _clean_up(admin: Any, name: str, redis_url: str, queue: str) -> None:
    """Drops the throwaway database and the bench queue (with its bindings)."""
    import redis
    from psycopg import sql

    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    admin.close()
    broker = redis.Redis.from_url(redis_url)
    broker.delete(queue)
    for binding in broker.scan_iter("_kombu.binding.*"):
        for member in broker.smembers(binding):
            if queue.encode() in member:
                broker.srem(binding, member)


def main_bench(args: argparse.Namespace) -> None:
    from store import repository
    from store.database import Database

    name, url, admin = _setup_database(args.postgres_url)
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    artifacts = tempfile.mkdtemp(prefix="stare-bench-")
    env = _service_env(args, url, queue, artifacts)
    try:
        db = Database(url, pool_size=1)
        with db.transaction() as session:
            tenant = repository.create_tenant(session, "bench")
            _, key = repository.create_api_key(session, tenant.id, "bench")
        db.dispose()
        auth = {"Authorization": f"Bearer {key}"}
        bare_port, service_port = _free_port(), _free_port()
        with (
            _server("bench.bench_service:bare_app", bare_port, env, "/bare", args.workers) as bare_server,
            _server(
                "bench.bench_service:service_app", service_port, env, "/healthz", args.workers
            ) as service_server,
        ):
            pids = {bare_port: bare_server.pid, service_port: service_server.pid}
            import httpx

            # Setup, not measured: the first POST waits for the service's task-checking processes to start
            # (service/offload.py; ~2 s on an idle core, 10 s at a load average of 12), past httpx's 5 s.
            setup = httpx.Client(base_url=f"http://127.0.0.1:{service_port}", headers=auth, timeout=120)
            with setup as client:
                job_ids = [
                    client.post("/v1/jobs", json={"spec": SPEC}).raise_for_status().json()["id"]
                    for _ in range(32)
                ]
            plans = _plans(bare_port, service_port, auth, job_ids)
            closed, opened = _run_rounds(args, plans, pids)
    finally:
        _clean_up(admin, name, args.redis_url, queue)

    print(
        f"\nService benchmark: {args.concurrency} concurrent connections, {args.rounds} rounds, "
        f"{args.workers} process(es) per server, rate limiter {args.rate_limiter}"
    )
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    report: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "command"}}
    if any(closed.values()):
        report["closed"] = report_closed(closed)
    if opened:
        report["open"] = report_open(args, opened)
    print_verdicts(args, report)
    if args.json:
        report["rounds"] = {
            "closed": closed,
            "open": [{"row": row, "rate": rate, "rounds": runs} for (row, rate), runs in opened.items()],
        }
        Path(args.json).write_text(json.dumps(report, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    sub = parser.add_subparsers(dest="command")
    load = sub.add_parser("load", help="(internal) the load generator process", allow_abbrev=False)
    load.add_argument("--plan", required=True)
    load.add_argument("--rate", type=float, default=0.0, help="open loop at this rate; 0: closed loop")
    for p in (parser, load):
        p.add_argument("--concurrency", type=int, default=64)
        p.add_argument("--duration", type=float, default=6.0, help="seconds per closed-loop row and round")
        p.add_argument("--max-requests", type=int, default=30_000, help="per closed-loop row and round")
        p.add_argument("--grace", type=float, default=3.0, help="open loop: seconds to catch up after")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mode", choices=("both", "closed", "open"), default="both")
    parser.add_argument(
        "--rates",
        type=lambda text: [float(r) for r in text.split(",")],
        default=[100.0, 200.0, 400.0, 800.0, 1600.0, 3200.0],
        help="open-loop offered rates (requests/s), comma-separated",
    )
    parser.add_argument("--open-duration", type=float, default=5.0, help="seconds per open-loop row")
    parser.add_argument(
        "--common-rate", type=float, default=200.0, help="the open-loop rate the p99 verdicts read"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="uvicorn worker processes, of the service and of the bare app"
    )
    parser.add_argument(
        "--rate-limiter",
        choices=("off", "memory", "redis"),
        default="off",
        help="the service's rate limiter: on with a limit never reached, so every request pays for it",
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--postgres-url", default=_common.DEFAULT_POSTGRES_URL, help=_common.POSTGRES_URL_HELP
    )
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--smoke", action="store_true", help=_common.SMOKE_HELP)
    args = parser.parse_args()
    _common.apply_smoke(
        args,
        rounds=1,
        concurrency=4,
        duration=0.5,
        max_requests=200,
        rates=[50.0],
        open_duration=0.5,
        common_rate=50.0,
        grace=0.5,
    )
    if args.command == "load":
        load_main(args)
    else:
        if args.common_rate not in args.rates:
            args.rates = sorted([*args.rates, args.common_rate])
        main_bench(args)


if __name__ == "__main__":
    main()
