"""The results page: docs/RESULTS.md (tables) and an HTML page with the same tables and the figures, drawn
by the job report's own chart code (trainer.report.line_chart_svg)."""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from experiments import analysis as an
from experiments import control_page, control_suite, stability_page
from experiments.plan import HEADLINE, Suite
from experiments.runner import RESULT_FILE, events_of, read_json, run_dir
from experiments.system import cpu_info, cpu_label
from trainer.report import BLUE, CSS_FILE, GREEN, GREY, ORANGE, PURPLE, VERMILION, Band, Trace, line_chart_svg

ARM_COLORS = {
    "grpo_ds": GREY,
    "stare_o1": BLUE,
    "stare_c2": PURPLE,
    "adaptive_entropy": VERMILION,
    "rsi_s": GREEN,
    "dapo": ORANGE,
    "forking_8020": "#56B4E9",
    "clip_cov": "#F0E442",
    "kl_cov": "#000000",
}
# The demo's own acceptance, per run: held-out avg@k up by at least this much, gate on for some steps.
DEMO_MIN_GAIN = 0.05
DEMO_MIN_GATE = 0.2


def collect(root: Path, plan: Sequence[Suite], baseline_root: Path | None = None) -> dict[str, Any]:
    """Summaries of every run of the plan that has events (unfinished ones are marked); an entropy-control
    cell also gets its target, noise floor and reused SmolLM2-suite runs (from `baseline_root`, default
    root/../smollm2: experiments/control_page.py)."""
    suites = []
    for suite in plan:
        runs = []
        for run in suite.runs:
            path = run_dir(root, run)
            events = events_of(path)
            if not events:
                continue
            result = read_json(path / RESULT_FILE) or {}
            summary = an.summarize_run(
                run.id,
                events,
                arm=run.arm,
                seed=run.seed,
                threads=run.threads,
                warmup_steps=suite.warmup_steps,
                collapse_streak=suite.collapse_steps,
                wall_seconds=result.get("wall_seconds"),
                plan_spec=run.spec,
            )
            runs.append({"summary": summary, "events": events, "cpu": result.get("cpu")})
        entry: dict[str, Any] = {"suite": suite, "runs": runs}
        if suite.name in control_suite.CELLS:
            entry.update(control_page.cell_extras(suite, root, baseline_root))
        suites.append(entry)
    return {"suites": suites}


# ------------------------------------------------------------------------------------------- tables


def _f(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _pm(ms: an.MeanStd, digits: int = 3) -> str:
    if ms.mean is None:
        return "–"
    return _f(ms.mean, digits) + (f" ± {_f(ms.std, digits)}" if ms.std is not None else "")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f} %"


def arm_rows(suite: Suite, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per arm: means ± std over its finished seeds."""
    rows = []
    for arm in suite.arms:
        sums = [r["summary"] for r in runs if r["summary"].arm == arm and r["summary"].finished]
        if not sums:
            continue
        collapses = [s.collapse_step for s in sums]
        hit = [c for c in collapses if c is not None]
        rows.append(
            {
                "arm": arm,
                "n": len(sums),
                "sft_avg": an.mean_std(s.sft_avg for s in sums),
                "final_avg": an.mean_std(s.final_avg for s in sums),
                "final_pass": an.mean_std(s.final_pass for s in sums),
                "in_band": an.mean_std(s.in_band_fraction for s in sums),
                "entropy_min": an.mean_std(s.entropy_min for s in sums),
                "entropy_last": an.mean_std(s.entropy_last for s in sums),
                "collapse": (
                    f"never (0/{len(sums)})"
                    if not hit
                    else f"{', '.join(str(c) for c in sorted(hit))} ({len(hit)}/{len(sums)})"
                ),
                "gate_on": an.mean_std(s.gate_on_fraction for s in sums),
                "length": an.mean_std(s.response_length for s in sums),
                "wall": an.mean_std(s.wall_seconds for s in sums),
                "k": sums[0].k,
            }
        )
    return rows


def paired(
    runs: list[dict[str, Any]], treat: str = HEADLINE[1], control: str = HEADLINE[0]
) -> list[an.PairedDiff]:
    by = {(r["summary"].arm, r["summary"].seed): r["summary"] for r in runs if r["summary"].finished}
    seeds = sorted(s for a, s in by if a == treat and (control, s) in by)
    out = []
    for metric in ("final_avg", "final_pass", "entropy_min", "entropy_last", "in_band_fraction"):
        pairs = [
            (getattr(by[(treat, s)], metric), getattr(by[(control, s)], metric))
            for s in seeds
            if getattr(by[(treat, s)], metric) is not None and getattr(by[(control, s)], metric) is not None
        ]
        out.append(an.paired_difference(metric, pairs))
    return out


def correlations(suite: Suite, runs: list[dict[str, Any]]) -> list[tuple[str, an.Correlation]]:
    out = []
    for arm in suite.arms:
        pairs = [
            p
            for r in runs
            if r["summary"].arm == arm and r["summary"].finished
            for p in an.drift_pairs(r["events"])
        ]
        if pairs:
            out.append((arm, an.pearson([p for p, _ in pairs], [m for _, m in pairs])))
    return out


def demo_verdict(s: an.RunSummary) -> tuple[bool, bool]:
    gain = None if s.final_avg is None or s.sft_avg is None else s.final_avg - s.sft_avg
    return (gain is not None and gain >= DEMO_MIN_GAIN, (s.gate_on_fraction or 0.0) >= DEMO_MIN_GATE)


# ------------------------------------------------------------------------------------------- markdown

PAIRED_LABELS = {
    "final_avg": "final avg@k",
    "final_pass": "final pass@k",
    "entropy_min": "minimum entropy",
    "entropy_last": "entropy at the last step",
    "in_band_fraction": "fraction of steps in band",
}


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def suite_markdown(entry: dict[str, Any]) -> str:
    suite: Suite = entry["suite"]
    runs = entry["runs"]
    parts = [f"### {suite.title}", "", suite.description, ""]
    if suite.name in control_suite.CELLS:
        return control_page.suite_markdown(entry)
    if not runs:
        return "\n".join([*parts, "_No run of this suite has been made yet._", ""])
    if suite.name == "demo" or suite.robustness:
        return "\n".join(parts + _acceptance_section(runs))
    if suite.stability:
        return stability_page.suite_markdown(entry)
    parts.append(_arm_table(suite, runs))
    parts += _stare_weight_lines(suite, runs)
    parts += _paired_section(runs)
    parts += _drift_section(suite, runs)
    parts.append("")
    return "\n".join(parts)


def _acceptance_section(runs: list[dict[str, Any]]) -> list[str]:
    """A demo or robustness suite: one row per run, judged by the demo's acceptance."""
    rows = []
    for r in runs:
        s: an.RunSummary = r["summary"]
        up, gate = demo_verdict(s)
        rows.append(
            [
                str(s.seed),
                str(s.threads),
                _f(s.sft_avg),
                _f(s.final_avg),
                _f(None if s.final_avg is None or s.sft_avg is None else s.final_avg - s.sft_avg),
                _pct(s.gate_on_fraction),
                _f(s.entropy_first),
                _f(s.entropy_min),
                _f(s.entropy_last),
                _pct(s.near_target_fraction),
                _f(s.wall_seconds, 0),
                "yes"
                if up and gate
                else ("no: " + ", ".join(x for x, ok in (("accuracy", up), ("gate", gate)) if not ok)),
            ]
        )
    table = _md_table(
        [
            "seed",
            "threads",
            "avg@k after SFT",
            "after RL",
            "gain",
            "gate on",
            "H first",
            "H min",
            "H last",
            "H near target after gate on",
            "wall s",
            "acceptance",
        ],
        rows,
    )
    ok = sum(all(demo_verdict(r["summary"])) for r in runs)
    gains = [
        r["summary"].final_avg - r["summary"].sft_avg
        for r in runs
        if r["summary"].final_avg is not None and r["summary"].sft_avg is not None
    ]
    return [
        table,
        "",
        f"Acceptance (avg@k up by ≥ {DEMO_MIN_GAIN:.2f} and gate on for ≥ {DEMO_MIN_GATE:.0%} of steps): "
        f"**{ok} of {len(runs)} runs**. Smallest gain {_f(min(gains) if gains else None)}, mean "
        f"{_f(sum(gains) / len(gains) if gains else None)}.",
        "",
    ]


def _arm_table(suite: Suite, runs: list[dict[str, Any]]) -> str:
    """A comparison suite: one row per algorithm, mean ± spread over its seeds."""
    arms = arm_rows(suite, runs)
    k = next((r["k"] for r in arms if r["k"]), None)
    return _md_table(
        [
            "algorithm",
            "seeds",
            f"avg@{k} after SFT",
            f"final avg@{k}",
            f"final pass@{k}",
            "steps in band",
            "min entropy",
            "last entropy",
            "collapse step (seeds that collapsed)",
            "gate on",
            "response length",
            "wall s",
        ],
        [
            [
                r["arm"],
                str(r["n"]),
                _pm(r["sft_avg"]),
                _pm(r["final_avg"]),
                _pm(r["final_pass"]),
                _pm(r["in_band"], 2),
                _pm(r["entropy_min"]),
                _pm(r["entropy_last"]),
                r["collapse"],
                _pm(r["gate_on"], 2) if r["gate_on"].mean is not None else "–",
                _pm(r["length"], 2),
                _pm(r["wall"], 0),
            ]
            for r in arms
        ],
    )


def _stare_weight_lines(suite: Suite, runs: list[dict[str, Any]]) -> list[str]:
    """How hard STARE pushes while its gate is on: the share of tokens it reweights and the mean weight."""
    parts: list[str] = []
    for arm in (a for a in suite.arms if a.startswith("stare")):
        sums = [r["summary"] for r in runs if r["summary"].arm == arm and r["summary"].finished]
        ratio = an.mean_std(s.reweight_ratio_when_on for s in sums)
        weight = an.mean_std(s.mean_weight_when_on for s in sums)
        if ratio.mean is not None:
            parts += [
                "",
                f"{arm} while the gate is on: positive reweight ratio |L⁺|/N {_pm(ratio)}, mean_weight "
                f"{_pm(weight, 4)} (seeds: {ratio.n}).",
            ]
    return parts


def _paired_section(runs: list[dict[str, Any]]) -> list[str]:
    """The headline pair's differences, seed by seed; nothing when no seed has both."""
    diffs = paired(runs)
    if not any(d.n for d in diffs):
        return []
    return [
        "",
        f"**{HEADLINE[1]} − {HEADLINE[0]}, paired by seed** (95 % t interval):",
        "",
        _md_table(
            ["metric", "mean difference", "95 % interval", "seeds", "verdict"],
            [
                [
                    PAIRED_LABELS[d.metric],
                    _f(d.mean),
                    f"[{_f(d.low)}, {_f(d.high)}]",
                    str(d.n),
                    "significant" if d.significant else "not significant",
                ]
                for d in diffs
            ],
        ),
    ]


def _drift_section(suite: Suite, runs: list[dict[str, Any]]) -> list[str]:
    """The first-order check: predicted entropy drift against the measured change, per algorithm."""
    corr = correlations(suite, runs)
    if not corr:
        return []
    return [
        "",
        "**First-order check**: predicted drift (η·Σ Â·Φ) against the measured change of entropy:",
        "",
        _md_table(
            ["algorithm", "r", "95 % interval", "n (steps)"],
            [[a, _f(c.r), f"[{_f(c.low)}, {_f(c.high)}]", str(c.n)] for a, c in corr],
        ),
    ]


def machine_markdown(data: dict[str, Any]) -> str:
    cpus = {
        json.dumps(r.get("cpu"), sort_keys=True) for e in data["suites"] for r in e["runs"] if r.get("cpu")
    }
    threads = sorted({r["summary"].threads for e in data["suites"] for r in e["runs"]})
    labels = [cpu_label(json.loads(c)) for c in sorted(cpus)] or [cpu_label(cpu_info()) + " (this machine)"]
    flags = sorted({f for c in cpus for f in json.loads(c).get("vector_extensions", [])})
    return (
        f"Runs made on: {'; '.join(labels)}. Vector extensions: {', '.join(flags) or 'unknown'}. "
        f"Torch threads per run: {', '.join(map(str, threads)) or '–'}."
    )


# ------------------------------------------------------------------------------------------- HTML


def _entropy_chart(suite: Suite, runs: list[dict[str, Any]], arms: Sequence[str]) -> str:
    traces: list[Trace] = []
    target: Any = None
    band: tuple[float, float] | None = None
    for arm in arms:
        series = [an.metric_series(r["events"], an.ENTROPY) for r in runs if r["summary"].arm == arm]
        series = [s for s in series if s]
        if not series:
            continue
        mean, lo, hi = an.seed_band(series)
        color = ARM_COLORS.get(arm, GREY)
        traces.append(Trace(f"{arm} (mean of {len(series)})", mean, color))
        if len(series) > 1:
            traces.append(Trace(f"{arm} seed min", lo, color, dashed=True))
            traces.append(Trace(f"{arm} seed max", hi, color, dashed=True))
    for r in runs:
        spec: dict[str, Any] = next((e["spec"] for e in r["events"] if e.get("type") == "started"), {})
        b = spec.get("entropy_band") or {}
        band = band or (float(b.get("low", 0.1)), float(b.get("high", 1.0)))
        logged = an.metric_series(r["events"], "entropy/target")  # resolved (a relative target too)
        spec_target = (spec.get("algorithm", {}).get("gate", {}) or {}).get("target_entropy")
        target = (
            target
            or (logged[-1][1] if logged else None)
            or (spec_target if isinstance(spec_target, int | float) else None)
        )
    xs = [x for t in traces for x, _ in t.points]
    if target is not None and xs:
        traces.append(
            Trace(
                "target entropy", [(min(xs), float(target)), (max(xs), float(target))], "#D55E00", dashed=True
            )
        )
    bands = [Band(-math.inf, math.inf, band[0], band[1])] if band else []
    return line_chart_svg(
        traces,
        title=f"{suite.name}: entropy over steps",
        y_label="entropy (nats)",
        bands=bands,
        band_label="entropy band",
        y_floor=0.0,
    )


def _series_chart(
    runs: list[dict[str, Any]], arms: Sequence[str], key: str, title: str, y: str, *, evals: bool = False
) -> str:
    traces = []
    for arm in arms:
        get = an.eval_series if evals else an.metric_series
        series = [get(r["events"], key) for r in runs if r["summary"].arm == arm]
        series = [s for s in series if s]
        if not series:
            continue
        mean, _, _ = an.seed_band(series)
        traces.append(Trace(f"{arm} (mean of {len(series)})", mean, ARM_COLORS.get(arm, GREY), shape="line"))
    return line_chart_svg(traces, title=title, y_label=y, y_floor=0.0)


def suite_html(entry: dict[str, Any]) -> str:
    suite: Suite = entry["suite"]
    runs = entry["runs"]
    md = suite_markdown(entry)
    if not runs:
        return f"<section class='card'><h2>{html.escape(suite.title)}</h2><p>No runs yet.</p></section>"
    arms = suite.arms
    figs = [
        _entropy_chart(suite, runs, arms),
        _series_chart(runs, arms, "eval/avg@k", f"{suite.name}: held-out avg@k", "avg@k", evals=True),
        _series_chart(runs, arms, "eval/pass@k", f"{suite.name}: held-out pass@k", "pass@k", evals=True),
        _series_chart(runs, arms, "response/length_mean", f"{suite.name}: response length", "tokens"),
        _series_chart(
            runs,
            [a for a in arms if a.startswith("stare")] or arms,
            "stare/gate_on",
            f"{suite.name}: gate on (fraction of seeds)",
            "gate on",
        ),
    ]
    if any(an.metric_series(r["events"], "tool/calls_per_response") for r in runs):  # a tool-use suite
        for key, title, y in (
            ("tool/calls_per_response", "tool calls per response", "calls"),
            ("tool/error_rate", "tool error rate (of calls)", "fraction"),
            ("tool/output_token_fraction", "tool-output share of response tokens (masked)", "fraction"),
        ):
            figs.append(_series_chart(runs, arms, key, f"{suite.name}: {title}", y))
    for q in ("pos_low", "pos_high", "neg_low", "neg_high"):
        figs.append(
            _series_chart(
                runs,
                [a for a in arms if a in HEADLINE] or arms,
                f"quadrant/{q}_fraction",
                f"{suite.name}: quadrant {q} token fraction",
                "fraction",
            )
        )
    return (
        f"<section class='card'><h2>{html.escape(suite.title)}</h2>{_md_to_html(md)}"
        + "".join(f"<figure>{svg}</figure>" for svg in figs)
        + "</section>"
    )


def _md_to_html(md: str) -> str:
    """The few markdown forms suite_markdown writes: tables, paragraphs, bold, headings (dropped)."""
    out: list[str] = []
    table: list[list[str]] = []

    def flush() -> None:
        if table:
            head, *body = [row for i, row in enumerate(table) if i != 1]
            out.append(
                "<table><thead><tr>"
                + "".join(f"<th>{html.escape(c)}</th>" for c in head)
                + "</tr></thead><tbody>"
                + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
                + "</tbody></table>"
            )
            table.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            table.append([c.strip() for c in line.strip("|").split("|")])
            continue
        flush()
        if line.startswith("#") or not line.strip():
            continue
        text = html.escape(line)
        while text.count("**") >= 2:
            text = text.replace("**", "<b>", 1).replace("**", "</b>", 1)
        out.append(f"<p>{text}</p>")
    flush()
    return "".join(out)


def stylesheet_href(html_path: Path) -> str:
    """The report's stylesheet (trainer/report/report.css), relative to the page's folder: the pages link the
    one stylesheet instead of carrying a copy each."""
    return Path(os.path.relpath(CSS_FILE.resolve(), html_path.resolve().parent)).as_posix()


def write_page(
    root: Path,
    plan: Sequence[Suite],
    md_path: Path,
    html_path: Path,
    *,
    header: str,
    footer: str,
    baseline_root: Path | None = None,
) -> dict[str, Any]:
    data = collect(root, plan, baseline_root)
    body = "\n".join(suite_markdown(e) for e in data["suites"])
    machine = machine_markdown(data)
    md = f"{header}\n\n## Machine\n\n{machine}\n\n## Results\n\n{body}\n{footer}\n"
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(md)
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>stare-rl results</title>'
        f'<link rel="stylesheet" href="{html.escape(stylesheet_href(html_path))}">'
        "<style>table{font-size:13px} figure{margin:12px 0}</style></head><body><main>"
        f"<section class='card'><h1>stare-rl: results</h1><p>{html.escape(machine)}</p>"
        "<p>Tables and definitions: docs/RESULTS.md. Solid lines: mean over seeds; dashed: seed min and max.</p></section>"
        + "".join(suite_html(e) for e in data["suites"])
        + "</main></body></html>\n"
    )
    html_path.parent.mkdir(parents=True, exist_ok=True)
    html_path.write_text(page)
    summary = {e["suite"].name: [asdict(r["summary"]) for r in e["runs"]] for e in data["suites"]}
    (root / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    return summary
