"""The report of bench_service.py: the rows, their p99 targets, and the closed-loop and open-loop tables and
verdicts it prints (and stores in its JSON)."""

from __future__ import annotations

import argparse
from typing import Any

BARE, GET, POST = "bare GET /bare", "GET /v1/jobs/{id}", "POST /v1/jobs"
GET_AT_40 = "GET at 40 % of bare"  # open loop at 0.4 × the bare row's saturated throughput of the round
P99_TARGET_MS = {GET: 50.0, POST: 100.0, GET_AT_40: 50.0}


def saturated(result: dict[str, Any]) -> bool:
    """The row could not carry its offered rate (it fell behind the schedule)."""
    return bool(result["unsent"]) or result["rps"] < 0.9 * result["offered_rps"]


def report_closed(closed: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    best = {row: max(runs, key=lambda r: r["rps"]) for row, runs in closed.items()}
    bare = best[BARE]["rps"]
    print("\nClosed loop (saturation): each connection sends its next request when the previous answer")
    print("arrives; best round by req/s. Mean latency here is connections / throughput (Little's law).")
    print(
        "load average (1 min) after each row: "
        + ", ".join(f"{r['load_average_1m']:.1f}" for r in best.values())
    )
    print(
        f"{'row':<22}{'req/s':>9}{'vs bare':>9}{'p50 ms':>9}{'p99 ms':>9}{'cpu ms/req':>12}{'requests':>10}"
        f"{'errors':>8}"
    )
    for row, r in best.items():
        r["vs_bare"] = r["rps"] / bare
        print(
            f"{row:<22}{r['rps']:>9.0f}{r['rps'] / bare:>9.1%}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
            f"{r['server_cpu_ms_per_request']:>12.2f}{r['requests']:>10}{r['errors']:>8}"
        )
    return best


def report_open(
    args: argparse.Namespace, opened: dict[tuple[str, float], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    print(
        f"\nOpen loop (rate-bounded): {args.concurrency} connections carry a constant offered rate for "
        f"{args.open_duration:g} s;\nlatency from each request's scheduled send time (queueing included). "
        "Best round by p99; 'worst' is the worst round's p99.\n'behind': the row fell behind its schedule "
        "(achieved < 90 % of offered, or requests left unsent); higher rates were skipped."
    )
    print(
        f"{'offered/s':>9} {'row':<22}{'achieved':>9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'worst':>9}"
        f"{'cpu ms/req':>11}{'lag p99':>9}{'unsent':>7}{'err':>5}{'load':>6}  verdict"
    )
    rows = []
    order = [BARE, GET, POST, GET_AT_40]
    for (row, key), runs in sorted(
        opened.items(), key=lambda item: (item[0][0] == GET_AT_40, item[0][1], order.index(item[0][0]))
    ):
        best = min(runs, key=lambda r: r["p99_ms"])
        rate = best["offered_rps"] if key == 0.0 else key
        worst_p99 = max(r["p99_ms"] for r in runs)
        target = P99_TARGET_MS.get(row)
        verdict = ""
        if saturated(best):
            verdict = "behind"
        if target is not None:
            verdict += (" " if verdict else "") + ("p99 met" if best["p99_ms"] <= target else "p99 NOT met")
        entry = {"row": row, "rate": rate, "rounds": len(runs), "worst_p99_ms": worst_p99, **best}
        entry["behind"] = saturated(best)
        rows.append(entry)
        print(
            f"{rate:>9g} {row:<22}{best['rps']:>9.0f}{best['p50_ms']:>9.1f}{best['p99_ms']:>9.1f}"
            f"{best['max_ms']:>9.1f}{worst_p99:>9.1f}{best['server_cpu_ms_per_request']:>11.2f}"
            f"{best['send_lag_p99_ms']:>9.1f}{best['unsent']:>7}{best['errors']:>5}"
            f"{best['load_average_1m']:>6.1f}  {verdict}"
        )
    return rows


def _slo_capacity(rows: list[dict[str, Any]], row: str) -> float | None:
    """The highest swept rate at which the row kept up and met its p99 target, with every lower swept rate
    meeting it too."""
    capacity = None
    for entry in sorted((e for e in rows if e["row"] == row), key=lambda e: e["rate"]):
        if entry["behind"] or entry["p99_ms"] > P99_TARGET_MS[row]:
            break
        capacity = entry["rate"]
    return capacity


def print_verdicts(args: argparse.Namespace, report: dict[str, Any]) -> None:
    print("\ntargets (64 clients): GET ≥ 40 % of bare throughput, GET p99 ≤ 50 ms, POST p99 ≤ 100 ms")
    closed, rows = report.get("closed"), report.get("open", [])
    if closed:
        get, post = closed[GET], closed[POST]
        ratio = get["vs_bare"]
        print(
            f"saturated (closed loop): GET {ratio:.1%} of bare ({'met' if ratio >= 0.4 else 'NOT met'}); "
            f"GET p99 {get['p99_ms']:.1f} ms ({'met' if get['p99_ms'] <= 50 else 'NOT met'}); "
            f"POST p99 {post['p99_ms']:.1f} ms ({'met' if post['p99_ms'] <= 100 else 'NOT met'})"
        )
    if not rows:
        return
    common = {e["row"]: e for e in rows if e["rate"] == args.common_rate}
    parts = []
    for row in (GET, POST):
        entry = common.get(row)
        if entry is None:
            parts.append(f"{row} not run at {args.common_rate:g}/s (behind at a lower rate: NOT met)")
            continue
        met = not entry["behind"] and entry["p99_ms"] <= P99_TARGET_MS[row]
        parts.append(f"{row} p99 {entry['p99_ms']:.1f} ms ({'met' if met else 'NOT met'})")
    print(f"rate-bounded at the common rate {args.common_rate:g}/s: " + "; ".join(parts))
    joint = [e for e in rows if e["row"] == GET_AT_40]
    if joint:
        entry = joint[0]
        met = not entry["behind"] and entry["p99_ms"] <= 50
        print(
            f"GET at 40 % of bare's saturated throughput ({entry['rate']:g}/s): achieved "
            f"{entry['rps']:.0f}/s, p99 {entry['p99_ms']:.1f} ms ({'met' if met else 'NOT met'})"
        )
    for row in (GET, POST):
        capacity = _slo_capacity(rows, row)
        shown = f"{capacity:g}/s" if capacity is not None else "none of the swept rates"
        print(
            f"{row}: p99 target held up to {shown} offered (swept: {', '.join(f'{r:g}' for r in args.rates)})"
        )
