"""The load of bench_event_loop.py and tests/security/test_event_loop.py (issue 44, R3): hostile JSON bodies
sent by several clients at once, authenticated and not, while a probe times GET /healthz.

- `worst_bodies()`: the bodies, each 1 MiB: the finding's (16-deep arrays of zeros and one `\\ud83d`
  escape), a string of escaped surrogate pairs ending in a lone one, the most values a body may hold with a
  lone surrogate after them (the slow path's walk) padded with long strings, and a string of escaped
  backslashes;
- `attack(...)`: `clients` connections, each sending one body after another (closed loop) to a POST route,
  half with a valid key (one key per client, each of its own tenant) and half with a wrong one; a refused
  connection is opened again;
- `probe(...)`: GET /healthz every `interval_s` on its own keep-alive connection: the latencies.

The attackers run in their own process (`python -m bench.event_loop_load attack ...`), so the probe's timing
shares no interpreter with them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
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

MIB = 1 << 20
PATH = "/v1/jobs/estimate"
ROOT = Path(__file__).resolve().parents[1]
PG = os.environ.get("STARE_TEST_PG_HOST", "127.0.0.1"), int(os.environ.get("STARE_TEST_PG_PORT", "5432"))


def worst_bodies(size: int = MIB, values: int = 10_000) -> dict[str, bytes]:
    deep = b"[" * 16 + b",".join([b"0"] * ((size - 64) // 2)) + b',"\\ud83d"' + b"]" * 16
    pairs = b'{"spec": {"name": "' + b"\\ud83d\\ude00" * ((size - 64) // 12) + b'\\ud83d"}}'
    filler = b'"' + b"x" * max(1, (size - values * 3) // 300) + b'"'
    walk = (
        b'{"spec": {}, "metadata": [' + b",".join([b"0"] * (values - 400) + [filler] * 300) + b',"\\udc00"]}'
    )
    slashes = b'{"spec": {"name": "' + b"\\\\" * ((size - 64) // 2) + b'"}}'
    return {"deep": deep[:size], "pairs": pairs, "walk": walk[:size], "slashes": slashes}


def request_bytes(path: str, key: str | None, body: bytes) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    if key is not None:
        head.append(f"Authorization: Bearer {key}")
    head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return int(head[9:12])


async def _client(port: int, requests: list[bytes], deadline: float, statuses: dict[int, int]) -> None:
    index = 0
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        try:
            while time.monotonic() < deadline:
                writer.write(requests[index % len(requests)])
                index += 1
                status = await asyncio.wait_for(_response(reader), 30)
                statuses[status] = statuses.get(status, 0) + 1
                if status in (401, 429, 413):  # the server may close a connection whose body it did not read
                    break
        except (TimeoutError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def attack(port: int, keys: list[str | None], seconds: float) -> dict[str, Any]:
    """Each entry of `keys` is a client (None or a wrong key: unauthenticated), for `seconds`."""
    bodies = list(worst_bodies().values())
    deadline = time.monotonic() + seconds
    statuses: dict[int, int] = {}
    tasks = [
        _client(
            port,
            [request_bytes(PATH, key, body) for body in bodies[i % len(bodies) :] + bodies],
            deadline,
            statuses,
        )
        for i, key in enumerate(keys)
    ]
    await asyncio.gather(*tasks)
    return {str(status): count for status, count in sorted(statuses.items())}


async def probe(port: int, seconds: float, interval_s: float = 0.02) -> list[float]:
    """GET /healthz latencies (seconds), one request every interval_s on a keep-alive connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    latencies = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            start = time.perf_counter()
            writer.write(request)
            status = await _response(reader)
            latencies.append(time.perf_counter() - start)
            if status != 200:
                raise RuntimeError(f"/healthz answered {status}")
            await asyncio.sleep(interval_s)
    finally:
        writer.close()
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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
def api(source: Path, url: str, artifacts: Path, nice: int = 0, **settings: str) -> Iterator[int]:
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
    cmd = ["nice", "-n", str(nice), sys.executable, "-m", "service", "serve", "--port", str(port)]
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


def measure(
    port: int, keys: list[str], unauthenticated: int, seconds: float, nice: int = 0
) -> dict[str, Any]:
    """The probe's latencies while the attackers run (their own process), and the attackers' answers."""
    # The attackers at the priority the bench was started with plus 10: `nice -n -10 bench_event_loop.py`
    # runs the API and the probe ahead of the machine's other work (a dedicated host), not of the attack.
    cmd = [
        "nice",
        "-n",
        str(nice),
        sys.executable,
        "-m",
        "bench.event_loop_load",
        "attack",
        "--port",
        str(port),
    ]
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


@contextlib.contextmanager
def _priority(nice: int) -> Iterator[None]:
    """This thread at `nice` for the block (the probe's own scheduling delay is no part of the API's)."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    if nice:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    try:
        yield
    finally:
        if nice:
            os.setpriority(os.PRIO_PROCESS, 0, before)


def run(
    source: Path, clients: int, seconds: float, authenticated: int | None = None, *, dedicated: bool = False
) -> dict[str, Any]:
    """`clients` attackers, `authenticated` of them (default half) with a valid key each. `dedicated` (root
    only): the API runs at nice -10 and the attackers at +10, so the machine's other work (a shared machine,
    the test suite's other worker) weighs on neither side; the API still competes with its attackers."""
    authenticated = clients // 2 if authenticated is None else authenticated
    api_nice, attacker_nice = (-10, 10) if dedicated and os.geteuid() == 0 else (0, 0)
    with database() as url, tempfile.TemporaryDirectory() as artifacts:
        keys = tenant_keys(url, authenticated)
        with api(source, url, Path(artifacts), api_nice) as port, _priority(api_nice):  # the probe's too
            idle = asyncio.run(probe(port, min(3.0, seconds)))
            loaded = measure(port, keys, clients - authenticated, seconds, attacker_nice)
    return {
        "source": str(source),
        "clients": {"authenticated": authenticated, "unauthenticated": clients - authenticated},
        "dedicated": api_nice != 0,
        "idle_healthz_ms_p99": round(1000 * percentile(idle, 0.99), 2),
        **loaded,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.event_loop_load")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("attack", help="send the worst bodies from several clients; print the answers")
    run.add_argument("--port", type=int, required=True)
    run.add_argument("--seconds", type=float, default=10.0)
    run.add_argument("--key", action="append", default=[], help="a valid key (one client each)")
    run.add_argument("--unauthenticated", type=int, default=4, help="clients with a wrong key")
    args = parser.parse_args(argv)
    keys: list[str | None] = [*args.key, *["sk-stare-wrong" + "x" * 40] * args.unauthenticated]
    print(json.dumps(asyncio.run(attack(args.port, keys, args.seconds))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
