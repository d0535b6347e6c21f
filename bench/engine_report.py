"""The results of bench_engine.py: each side's summary over its timed steps and the markdown tables."""

from __future__ import annotations

import statistics
from typing import Any

from engine_cases import STARE_OVERHEAD_TARGET, TARGET_VS_TRL, VARIANTS
from engine_sides import Side


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarise_side(side: Side, warmup: int, rss: int) -> dict[str, Any]:
    timed = side.records[warmup:]
    seconds = [r["seconds"] for r in timed]
    cpu = [r["cpu_seconds"] for r in timed]
    return {
        "setup_s": side.setup_s,
        "torch_threads": side.threads,
        "step_s": seconds,
        "median_step_s": median(seconds),
        "min_step_s": min(seconds) if seconds else float("nan"),
        "cpu_step_s": cpu,
        "median_cpu_step_s": median(cpu),
        "median_generation_s": median([r["generation_seconds"] for r in timed]),
        "median_update_s": median([r["update_seconds"] for r in timed]),
        "tokens_per_step": median([r["tokens"] for r in timed]),
        "response_tokens_per_step": median([r["response_tokens"] for r in timed]),
        "tokens_per_s": median([r["tokens"] / r["seconds"] for r in timed]),
        "response_tokens_per_s": median([r["response_tokens"] / r["seconds"] for r in timed]),
        "peak_rss_bytes": rss,
        **(
            {"zero_std_fraction": median([r["zero_std_fraction"] for r in timed])}
            if "zero_std_fraction" in timed[0]
            else {}
        ),
        **({"gate_on_fraction": median([r["gate_on"] for r in timed])} if "gate_on" in timed[0] else {}),
    }


def fmt_rss(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def markdown(vs_trl: list[dict[str, Any]], stare: list[dict[str, Any]]) -> str:
    lines = [
        "| model, batch | side | median step, wall (s) | generation / update (s) | median step, CPU (s) "
        "| tokens/step (response) | tokens/s | peak RSS | groups with equal rewards "
        "| speed-up vs TRL, wall: median of pairs (of medians) [quartiles] | CPU time "
        "| vs TRL with our heap setting | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in vs_trl:
        target = TARGET_VS_TRL.get(r["case"]["model"], float("nan"))
        for n, key in enumerate(r["case"]["variants"]):
            s = r["sides"][key]
            zero = f"{s['zero_std_fraction']:.0%}" if "zero_std_fraction" in s else ""
            cells = [
                r["label"] if n == 0 else "",
                VARIANTS[key][0],
                f"{s['median_step_s']:.3f}",
                f"{s['median_generation_s']:.3f} / {s['median_update_s']:.3f}",
                f"{s['median_cpu_step_s']:.3f}",
                f"{s['tokens_per_step']:.0f} ({s['response_tokens_per_step']:.0f})",
                f"{s['tokens_per_s']:.0f}",
                fmt_rss(s["peak_rss_bytes"]),
                zero,
            ]
            vs = r["ratios"].get(key, {}).get("trl")
            if VARIANTS[key][1] == "ours" and vs is not None:
                q = vs["quartiles"]
                cells += [
                    f"**{vs['median_pair_ratio']:.2f}×** ({vs['ratio_of_medians']:.2f}×) "
                    f"[{q[0]:.2f} / {q[len(q) // 2]:.2f} / {q[-1]:.2f}]",
                    f"{vs['median_cpu_pair_ratio']:.2f}×",
                ]
                heap_vs = r["ratios"][key].get("trl_heap")
                cells.append(f"{heap_vs['median_pair_ratio']:.2f}×" if heap_vs else "")
                if key == "ours":
                    cells += [f"≥ {target}×", "yes" if vs["median_pair_ratio"] >= target else "no"]
                else:
                    cells += ["", ""]
            else:
                cells += ["", "", "", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| model, batch | algorithm | median step, wall (s) | generation / update (s) | median step, CPU (s) "
        "| peak RSS | STARE overhead, wall: median of pairs (of medians) | overhead, CPU time | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in stare:
        vs = r["ratios"]["grpo_ds"]["stare"]
        over = vs["median_pair_ratio"] - 1
        for algo in ("grpo_ds", "stare"):
            s = r["sides"][algo]
            gate = f" (gate on in {s['gate_on_fraction']:.0%} of steps)" if "gate_on_fraction" in s else ""
            lines.append(
                f"| {r['label'] if algo == 'grpo_ds' else ''} | {algo}{gate} | {s['median_step_s']:.3f} "
                f"| {s['median_generation_s']:.3f} / {s['median_update_s']:.3f} | {s['median_cpu_step_s']:.3f} "
                f"| {fmt_rss(s['peak_rss_bytes'])} "
                + (
                    f"| **{over:+.1%}** ({vs['ratio_of_medians'] - 1:+.1%}) "
                    f"| {vs['median_cpu_pair_ratio'] - 1:+.1%} | ≤ +3 % "
                    f"| {'yes' if over <= STARE_OVERHEAD_TARGET else 'no'} |"
                    if algo == "stare"
                    else "| | | | |"
                )
            )
    return "\n".join(lines)
