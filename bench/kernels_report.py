"""The results of bench_kernels.py: one row per chunked/naive pair (`summarise`, with the targets' verdicts)
and the markdown tables printed and stored with them."""

from __future__ import annotations

from typing import Any

import torch

GIB = 1024**3
MEMORY_RATIO_TARGET = 0.3  # chunked working memory ≤ 0.3 × naive
TIME_RATIO_TARGET = 1.1  # chunked time ≤ 1.1 × naive


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / GIB:.2f}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def summarise(group: str, chunked: dict[str, Any], naive: dict[str, Any] | None) -> dict[str, Any]:
    def get(record: dict[str, Any] | None, key: str) -> float | None:
        return None if record is None or "error" in record else record.get(key)

    if group == "sweep":
        return {"group": group, "name": chunked["case"]["name"], "chunked": chunked, "naive": None}
    row = {
        "group": group,
        "name": chunked["case"]["name"],
        "tokens": chunked["case"]["tokens"],
        "chunk_rows": chunked["case"]["chunk_rows"],
        "chunked": chunked,
        "naive": naive,
        "time_ratio": _ratio(get(chunked, "median_s"), get(naive, "median_s")),
        "working_memory_ratio": _ratio(get(chunked, "working_bytes"), get(naive, "working_bytes")),
        "total_peak_ratio": _ratio(get(chunked, "peak_rss_bytes"), get(naive, "peak_rss_bytes")),
    }
    case = chunked["case"]
    if case["mode"] == "forward+backward" and not case.get("grad_in_logits"):
        # Both versions must return the logits' gradient, (N, V) in the logits' dtype; what each needs
        # beyond that output is the kernel's own cost. (With grad_in_logits the chunked version returns
        # it in the logits' memory: no such row.)
        itemsize = torch.empty((), dtype=getattr(torch, case["dtype"])).element_size()
        grad = case["tokens"] * case["vocab"] * itemsize
        c_work, n_work = get(chunked, "working_bytes"), get(naive, "working_bytes")
        row["gradient_bytes"] = grad
        row["working_beyond_gradient_ratio"] = _ratio(
            None if c_work is None else c_work - grad, None if n_work is None else n_work - grad
        )
    row["time_target_met"] = None if row["time_ratio"] is None else row["time_ratio"] <= TIME_RATIO_TARGET
    row["memory_target_met"] = (
        None if row["working_memory_ratio"] is None else row["working_memory_ratio"] <= MEMORY_RATIO_TARGET
    )
    return row


def _yes_no(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "**no**")


def markdown_tables(rows: list[dict[str, Any]], naive_bf16_forward: dict[str, Any] | None) -> str:
    def sec(record: dict[str, Any] | None, key: str = "median_s") -> str:
        if record is None:
            return "n/a"
        if "error" in record:
            return "skipped" if record["error"].startswith("skipped") else "failed"
        calls = f" ({len(record['times_s'])})" if key == "median_s" else ""
        return f"{record[key]:.2f}{calls}"

    def mem(record: dict[str, Any] | None, key: str) -> str:
        return "n/a" if record is None or "error" in record else _gib(record[key])

    lines = [
        "| row | tokens | chunk rows | time chunked / naive (s, median (calls)) | time ratio | working mem "
        "chunked / naive (GiB) | working ratio | total peak RSS chunked / naive (GiB) | total ratio "
        "| time ≤ 1.1× | working mem ≤ 0.3× |",
        "|---|---:|---:|---|---:|---|---:|---|---:|:---:|:---:|",
    ]
    for row in rows:
        if row["group"] == "sweep":
            continue
        c, n = row["chunked"], row["naive"]
        lines.append(
            f"| {row['name']} | {row['tokens']:,} | {row['chunk_rows']} | {sec(c)} / {sec(n)} "
            f"| {_fmt_ratio(row['time_ratio'])} | {mem(c, 'working_bytes')} / {mem(n, 'working_bytes')} "
            f"| {_fmt_ratio(row['working_memory_ratio'])} | {mem(c, 'peak_rss_bytes')} / "
            f"{mem(n, 'peak_rss_bytes')} | {_fmt_ratio(row['total_peak_ratio'])} "
            f"| {_yes_no(row['time_target_met'])} | {_yes_no(row['memory_target_met'])} |"
        )
    backward_rows = [r for r in rows if "working_beyond_gradient_ratio" in r]
    if backward_rows:
        lines += [
            "",
            "Forward+backward rows, working memory beyond the logits' gradient (an output both return):",
            "",
        ]
        for row in backward_rows:
            c, n, grad = row["chunked"], row["naive"], row["gradient_bytes"]
            beyond = ["n/a" if r is None or "error" in r else _gib(r["working_bytes"] - grad) for r in (c, n)]
            lines.append(
                f"- {row['name']}: gradient {_gib(grad)} GiB; beyond it chunked {beyond[0]} GiB, naive "
                f"{beyond[1]} GiB (ratio {_fmt_ratio(row['working_beyond_gradient_ratio'])})"
            )
    sweep = next((r["chunked"] for r in rows if r["group"] == "sweep"), None)
    if sweep is not None:
        lines += [
            "",
            "Chunk-size sweep (chunked forward, bf16 logits, all sizes interleaved in one process):",
            "",
        ]
        if "error" in sweep:
            lines.append(f"failed: {sweep['error'][:200]}")
            return "\n".join(lines)
        naive = None if naive_bf16_forward is None or "error" in naive_bf16_forward else naive_bf16_forward
        entries = sweep["sweep"]
        fastest = min(e["median_s"] for e in entries)
        lines += [
            "| chunk rows | time (s, median (calls)) | time (s, min) | time / fastest size | time / naive bf16 "
            "forward | working mem (GiB) | working / naive bf16 forward |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for e in entries:
            time_ratio = _ratio(e["median_s"], None if naive is None else naive["median_s"])
            mem_ratio = _ratio(e["working_bytes"], None if naive is None else naive["working_bytes"])
            lines.append(
                f"| {e['chunk_rows']} | {e['median_s']:.2f} ({len(e['times_s'])}) | {e['min_s']:.2f} "
                f"| {e['median_s'] / fastest:.3f} | {_fmt_ratio(time_ratio)} | {_gib(e['working_bytes'])} "
                f"| {_fmt_ratio(mem_ratio)} |"
            )
    return "\n".join(lines)
