"""The page section of a stability suite (the SmolLM2 suites): per method over seeds, time to collapse and
the share of post-gate steps within ±25 % of the target (contract/stability.py), every method paired with
grpo_ds by seed, the drift analysis (experiments/drift.py), and what is still running.

A run that has not finished is never in a table or a comparison; it is listed with the steps it has
logged, so a partial page says exactly what it is made of.
"""

from __future__ import annotations

from typing import Any

from experiments import analysis as an
from experiments import drift
from experiments.plan import Suite

CONTROL = "grpo_ds"
PAIRED_METRICS = {
    "final_avg": "final avg@k",
    "entropy_last": "last entropy",
    "hold_fraction": "post-gate steps within ±25 % of target",
    "collapse_or_end": "time to collapse (steps; not collapsed = run length + 1)",
}
# A method held the target on a suite when, on every seed, it did not collapse and at least this share of its
# post-gate steps had entropy within ±25 % of the target.
HELD_SHARE = 0.5


def _f(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _pm(ms: an.MeanStd, digits: int = 3) -> str:
    if ms.mean is None:
        return "–"
    return _f(ms.mean, digits) + (f" ± {_f(ms.std, digits)}" if ms.std is not None else "")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _finished(runs: list[dict[str, Any]], arm: str) -> list[an.RunSummary]:
    return [r["summary"] for r in runs if r["summary"].arm == arm and r["summary"].finished]


def progress_lines(suite: Suite, runs: list[dict[str, Any]]) -> list[str]:
    """Finished / running / not started, by run; the page is partial while any run is not finished."""
    logged = {r["summary"].run: r["summary"] for r in runs}
    done = [r for r in suite.runs if r.id in logged and logged[r.id].finished]
    running = [r for r in suite.runs if r.id in logged and not logged[r.id].finished]
    waiting = len(suite.runs) - len(done) - len(running)
    wall = an.mean_std(logged[r.id].wall_seconds for r in done)
    out = [
        f"**Progress**: {len(done)} of {len(suite.runs)} runs finished"
        + (f" (wall time per run {_pm(wall, 0)} s)" if done else "")
        + (f"; {len(running)} started, not finished" if running else "")
        + (f"; {waiting} not started" if waiting else "")
        + (". **Partial: the tables cover the finished runs only.**" if running or waiting else "."),
    ]
    if running:
        out += ["", "Started, not finished (steps logged): " + ", ".join(
            f"{r.name} ({logged[r.id].steps})" for r in running
        ) + "."]  # fmt: skip
    return out


def stability_table(suite: Suite, runs: list[dict[str, Any]]) -> str:
    rows = []
    for arm in suite.arms:
        sums = _finished(runs, arm)
        if not sums:
            continue
        hit = sorted(s.collapse_time for s in sums if s.collapse_time is not None)
        rows.append(
            [
                arm,
                str(len(sums)),
                _pm(an.mean_std(s.sft_avg for s in sums)),
                _pm(an.mean_std(s.final_avg for s in sums)),
                _pm(an.mean_std(s.entropy_first for s in sums)),
                _pm(an.mean_std(s.entropy_last for s in sums)),
                (", ".join(map(str, hit)) or "never") + f" ({len(hit)}/{len(sums)})",
                _pm(an.mean_std(s.hold_fraction for s in sums), 2),
                _pm(an.mean_std(s.gate_on_fraction for s in sums), 2),
                _pm(an.mean_std(s.mean_weight_when_on for s in sums), 4),
                _pm(an.mean_std(s.wall_seconds for s in sums), 0),
            ]
        )
    if not rows:
        return "_No run of this suite has finished yet._"
    k = next((s.k for r in runs for s in [r["summary"]] if s.k), None)
    header = ["method", "seeds", f"start avg@{k}", f"final avg@{k}", "first entropy", "last entropy"]
    header += ["time to collapse (seeds collapsed)", "held ±25 % of target", "gate on", "mean weight (on)"]
    return _table([*header, "wall s"], rows)


def _value(s: an.RunSummary, metric: str) -> float | None:
    if metric == "collapse_or_end":
        return float(s.collapse_time) if s.collapse_time is not None else float(s.steps + 1)
    value = getattr(s, metric)
    return None if value is None else float(value)


def paired_diffs(suite: Suite, runs: list[dict[str, Any]]) -> dict[str, dict[str, an.PairedDiff]]:
    """Per method (not the control) and metric: method minus grpo_ds over the seeds both have finished."""
    control = {s.seed: s for s in _finished(runs, CONTROL)}
    out: dict[str, dict[str, an.PairedDiff]] = {}
    for arm in suite.arms:
        if arm == CONTROL:
            continue
        treated = {s.seed: s for s in _finished(runs, arm)}
        for metric in PAIRED_METRICS:
            pairs = [
                (t, c)
                for seed in sorted(set(treated) & set(control))
                for t, c in [(_value(treated[seed], metric), _value(control[seed], metric))]
                if t is not None and c is not None
            ]
            if pairs:
                out.setdefault(arm, {})[metric] = an.paired_difference(metric, pairs)
    return out


def paired_against_control(suite: Suite, runs: list[dict[str, Any]]) -> list[str]:
    """Every method minus grpo_ds, paired by seed, with a 95 % t interval."""
    rows = []
    for arm, diffs in paired_diffs(suite, runs).items():
        for metric, d in diffs.items():
            verdict = "significant" if d.significant else "not significant"
            if d.n < 3:
                verdict += f" (n = {d.n} < 3)"
            rows.append(
                [arm, PAIRED_METRICS[metric], _f(d.mean), f"[{_f(d.low)}, {_f(d.high)}]", str(d.n), verdict]
            )
    if not rows:
        return []
    return [
        "",
        f"**Every method − {CONTROL}, paired by seed** (95 % t interval; significant only with ≥ 3 seeds):",
        "",
        _table(["method", "metric", "mean difference", "95 % interval", "seeds", "verdict"], rows),
    ]


def held_target(sums: list[an.RunSummary]) -> bool:
    """Held the target: on every seed no collapse and at least HELD_SHARE of the post-gate steps in the band."""
    return bool(sums) and all(
        s.collapse_time is None and s.hold_fraction is not None and s.hold_fraction >= HELD_SHARE
        for s in sums
    )


def _effects(diffs: dict[str, an.PairedDiff]) -> str:
    """The significant differences from the control, in words; the rest is said to be indistinguishable."""
    words = {
        "final_avg": ("accuracy higher", "accuracy lower"),
        "entropy_last": ("last entropy higher", "last entropy lower"),
        "hold_fraction": ("more steps in the band", "fewer steps in the band"),
        "collapse_or_end": ("collapse later", "collapse earlier"),
    }
    parts = []
    for metric, d in diffs.items():
        if d.significant and d.mean is not None:
            digits = 1 if metric == "collapse_or_end" else 3
            up, down = words[metric]
            parts.append(
                f"{up if d.mean > 0 else down} ({d.mean:+.{digits}f}, [{_f(d.low, digits)}, {_f(d.high, digits)}])"
            )
    if parts:
        return "; ".join(parts)
    n = max((d.n for d in diffs.values()), default=0)
    return "none significant (cannot be told from grpo_ds)" if n >= 3 else f"– ({n} paired seed(s); 3 needed)"


def verdict_lines(suite: Suite, runs: list[dict[str, Any]]) -> list[str]:
    """Per method, the guidance a user acts on: did it hold the target, and what differed from grpo_ds."""
    diffs = paired_diffs(suite, runs)
    seeds = {arm: sum(1 for r in suite.runs if r.arm == arm) for arm in suite.arms}
    rows = []
    for arm in suite.arms:
        sums = _finished(runs, arm)
        if not sums:
            continue
        shares = [s.hold_fraction for s in sums if s.hold_fraction is not None]
        collapsed = sum(s.collapse_time is not None for s in sums)
        if len(sums) < seeds[arm]:
            held = f"not yet known ({len(sums)} of {seeds[arm]} seeds)"
        else:
            held = "yes" if held_target(sums) else "no"
        rows.append(
            [
                arm,
                held,
                f"{_f(min(shares), 2)}–{_f(max(shares), 2)}" if shares else "–",
                f"{collapsed}/{len(sums)}",
                "(the control)" if arm == CONTROL else _effects(diffs.get(arm, {})),
            ]
        )
    if not rows:
        return []
    return [
        "",
        f"**Which setting held the target** (held: on every seed no collapse and at least {100 * HELD_SHARE:.0f} % of "
        "the post-gate steps within ±25 % of the target; differences: the significant ones of the paired "
        "table, 95 % interval):",
        "",
        _table(
            [
                "method",
                "held the target",
                "held share (seeds' range)",
                "collapsed",
                "significant differences from grpo_ds",
            ],
            rows,
        ),
    ]


def drift_lines(suite: Suite, runs: list[dict[str, Any]]) -> list[str]:
    """The drift analysis over every logged post-gate step of the headline pair (finished or not)."""
    per_run = []
    for r in runs:
        if r["summary"].arm not in ("grpo_ds", "stare_o1"):
            continue
        spec: dict[str, Any] = next((e["spec"] for e in r["events"] if e.get("type") == "started"), {})
        logged = an.metric_series(r["events"], "entropy/target")
        target = logged[-1][1] if logged else an.spec_target(spec, an.metric_series(r["events"], an.ENTROPY))
        per_run.append(drift.step_drifts(drift.run_steps(r["events"]), target))
    a = drift.analyse(per_run)
    if not a.steps:
        return []
    bound = ", ".join(f"W = {w}: {100 * c:.1f} %" for w, c in a.cancel_bound_at.items())
    est = ", ".join(f"W = {w}: {100 * c:.1f} %" for w, c in a.cancel_estimate_at.items())
    c2 = ", ".join(f"M = {m}: {100 * c:.1f} %" for m, c in a.cancel_c2_at.items())
    which = "post-gate steps (H̄ < target)" if a.post_gate else "steps (none was post-gate yet)"
    return [
        "",
        f"**Drift analysis** (experiments/drift.py; medians over {a.steps} {which} with D < 0 of {a.runs} "
        f"grpo_ds/stare_o1 runs, finished or not): predicted drift D = {_f(a.total, 4)}; the Â > 0, s > H "
        f"quadrant contributes D⁺ₕ = +{_f(a.pos_high, 4)}, the Â < 0, s > H quadrant D⁻ₕ = {_f(a.neg_high, 4)}. "
        f"L⁺ holds {_f(a.l_plus_share, 2)} of the first quadrant's tokens (median); on "
        f"{100 * a.l_plus_exceeds:.0f} % of the steps L⁺ is larger than that quadrant, so it also up-weights "
        "s ≤ H tokens and the bound below is optimistic there. Share of −D that O1's weight W on L⁺ cancels, "
        f"at most (bound): {bound}; by the token-share estimate: {est}. W that cancels D: ≥ "
        f"{_f(a.w_bound, 1)} (bound), about {_f(a.w_estimate, 1)} (estimate). Summed over these steps "
        f"(the steps with large drifts weigh more): W = 1.1 cancels {_pct(a.cancel_summed)} of Σ(−D), and "
        f"W = 1 + Σ(−D)/Σ D⁺ₕ = {_f(a.w_summed, 2)} would cancel it. C2's M on L⁻ (at most, if L⁻ "
        f"held the whole Â < 0, s > H quadrant): {c2}.",
    ]


def suite_markdown(entry: dict[str, Any]) -> str:
    suite: Suite = entry["suite"]
    runs = entry["runs"]
    parts = [f"### {suite.title}", "", suite.description, ""]
    parts += progress_lines(suite, runs)
    parts += ["", stability_table(suite, runs)]
    parts += verdict_lines(suite, runs)
    parts += paired_against_control(suite, runs)
    parts += drift_lines(suite, runs)
    parts.append("")
    return "\n".join(parts)
