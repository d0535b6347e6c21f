"""The load generator of bench_service.py, the process it starts with `load`: an asyncio HTTP/1.1 client on
keep-alive connections, closed loop (`_run_load`: each connection sends its next request when the previous
answer is complete) or open loop (`_run_open_loop`: a constant offered rate, each request timed from its
scheduled send time). bench_service.py's docstring describes both modes."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any


def request_bytes(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
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


async def _open_loop_worker(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    requests: list[bytes],
    schedule: _Schedule,
    out: _OpenLoopResult,
) -> None:
    """One connection of the open loop: take the next scheduled request, wait for its time (never for the
    server), send it, and time it from when it was *scheduled* (so queueing behind a busy connection or a
    slow server counts: no coordinated omission)."""
    try:
        while (index := schedule.take()) is not None:
            scheduled = schedule.start + index / schedule.rate
            now = time.perf_counter()
            if now < scheduled:
                await asyncio.sleep(scheduled - now)
                now = time.perf_counter()
            if now > schedule.stop_sending:
                out.unsent.append(scheduled)  # the generator never got a free connection in time
                continue
            out.send_lag.append(now - scheduled)
            writer.write(requests[index % len(requests)])
            status = await _read_response(reader)
            done = time.perf_counter()
            out.latencies.append(done - scheduled)
            out.last_done = max(out.last_done, done)
            if status >= 400:
                out.errors.append(status)
    finally:
        writer.close()


class _Schedule:
    """Request i is due at start + i / rate (a constant rate, as wrk2 schedules it)."""

    def __init__(self, rate: float, total: int, start: float, stop_sending: float) -> None:
        self.rate, self.total, self.start, self.stop_sending = rate, total, start, stop_sending
        self.next = 0

    def take(self) -> int | None:
        if self.next >= self.total:
            return None
        self.next += 1
        return self.next - 1


class _OpenLoopResult:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.send_lag: list[float] = []
        self.unsent: list[float] = []
        self.errors: list[int] = []
        self.last_done = 0.0


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] if sorted_values else 0.0


async def _run_open_loop(
    port: int, requests: list[bytes], concurrency: int, rate: float, duration: float, grace: float
) -> dict[str, Any]:
    """`concurrency` keep-alive connections carry `rate` requests/s for `duration` seconds, each request
    scheduled in advance. Requests still unsent `grace` seconds after the schedule ends are not sent; they
    count with the time they had waited by then (a lower bound), so an overloaded row cannot look good."""
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(concurrency)]
    total = max(1, int(rate * duration))
    start = time.perf_counter() + 0.05
    schedule = _Schedule(rate, total, start, start + duration + grace)
    out = _OpenLoopResult()
    await asyncio.gather(*(_open_loop_worker(r, w, requests, schedule, out) for r, w in connections))
    end = time.perf_counter()
    censored = [end - scheduled for scheduled in out.unsent]
    latencies = sorted(out.latencies + censored)
    lag = sorted(out.send_lag)
    window = max(out.last_done, start + 1e-9) - start
    return {
        "offered_rps": rate,
        "scheduled": total,
        "requests": len(out.latencies),
        "unsent": len(out.unsent),
        "seconds": window,
        "rps": len(out.latencies) / window,
        "p50_ms": 1000 * _percentile(latencies, 0.50),
        "p99_ms": 1000 * _percentile(latencies, 0.99),
        "max_ms": 1000 * latencies[-1],
        "send_lag_p99_ms": 1000 * _percentile(lag, 0.99),
        "warmup_requests": 0,
        "errors": len(out.errors),
        "error_statuses": sorted(set(out.errors))[:5],
    }


def load_main(args: argparse.Namespace) -> None:
    spec = json.loads(Path(args.plan).read_text())
    requests = [
        request_bytes(r["method"], r["path"], r["headers"], r.get("body", "").encode())
        for r in spec["requests"]
    ]
    if args.rate > 0:
        result = asyncio.run(
            _run_open_loop(spec["port"], requests, args.concurrency, args.rate, args.duration, args.grace)
        )
    else:
        result = asyncio.run(
            _run_load(spec["port"], requests, args.concurrency, args.duration, args.max_requests)
        )
    print(json.dumps(result))
