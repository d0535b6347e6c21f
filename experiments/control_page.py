"""The page section of an entropy-control cell (experiments/control_suite.py): per arm and seed, holding as
users see it (contract/stability.py: collapse, the settling step, the 5-step moving average's share in
±25 % of the target from it on, the mean |H − H*|/H* over the same steps, the per-step share beside them),
the noise floor where measured, the verdict per arm ("held", or by how much it missed and why), and the
accuracy cost: final avg@k against grpo_ds, paired by seed, with a 95 % t interval.

On the a+b cells grpo_ds is not rerun: its runs come from the SmolLM2 suite at the cell's learning rate
(same task, same seeds; `baseline` in the entry, read by experiments/page.py's collect), and its holding is
measured against the cell's own target. A run that has not finished is listed with its statistics so far
and marked; it is never in a verdict or a paired difference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.control import pi as cm
from contract.stability import HOLD_TOLERANCE, collapse_step, holding, moving_average, near_target, step_noise
from experiments import analysis as an
from experiments.plan import Suite
from experiments.stability_page import progress_lines

BASELINE = "grpo_ds"
# "Held" (issue 33's acceptance): on every seed no collapse, at least HELD_MA_SHARE of the post-settling
# steps with the 5-step moving average in ±25 % of the target, and a mean |H − H*|/H* of at most
# HELD_MAX_DEVIATION over the same steps.
HELD_MA_SHARE = 0.9
HELD_MAX_DEVIATION = 0.12
# A mean relative deviation below about this multiple of the noise floor's relative sd is out of reach for
# any controller (docs/ALGORITHMS.md §11.8).
NOISE_REACH = 0.8
# Noise floors measured (`python -m experiments.noise_floor`, seed 0; docs/ALGORITHMS.md §11.8): relative sd of
# H̄ for one fixed policy at the cell's batch. A file NOISE_FILE in the cell's run folder (that command's
# output) takes precedence. SmolLM2 on a+b: 30 re-samples (experiments/noise-floor-control-tune.json; an
# earlier 8 gave 0.060).
SMOLLM2_AB_FLOOR = (0.127, "the pretrained SmolLM2 policy on a+b at 4 × 8, 30 re-samples")
MEASURED_FLOORS: dict[str, tuple[float, str]] = {
    "control-tune": SMOLLM2_AB_FLOOR,
    "control-lr3e-6": SMOLLM2_AB_FLOOR,
    "control-t0.5": SMOLLM2_AB_FLOOR,
    "control-t0.8": SMOLLM2_AB_FLOOR,
    "control-abs": SMOLLM2_AB_FLOOR,
    "control-clip2": SMOLLM2_AB_FLOOR,  # the same policy at the start and batch (the epochs come after)
    "control-tiny": (0.023, "the tiny demo model after its SFT at 32 × 8, 8 re-samples"),
}
NOISE_FILE = "noise_floor.json"
# Where a run's entropy ended: the mean H̄ of its last END_STEPS steps, over the target.
END_STEPS = 10
CLIP_FRACTION = "clip/fraction"  # tokens the ratio clip bound, per step (docs/metrics.md)


@dataclass(frozen=True)
class SeedRow:
    """One run's holding statistics against its target (module docstring)."""

    arm: str
    seed: int
    finished: bool
    steps: int
    reused: bool  # a run of the SmolLM2 suite, not of this cell
    target: float | None
    collapse: int | None
    settling_step: int | None
    ma_share: float | None
    mean_deviation: float | None
    step_share: float | None  # raw H̄ within ±25 % over the same post-settling steps
    clip_share: float | None  # post-settling steps with the law's output at its clip
    longest_clip: int | None
    final_avg: float | None
    end_ratio: float | None = None  # mean H̄ of the last END_STEPS steps over the target
    # Why a run missed, measured over the post-settling steps: the step noise during the run (relative to the
    # target, contract/stability.step_noise), the moving average's share above and below the band, and the
    # share of steps with the law's output at its lowering clip (u = −u_min).
    run_noise: float | None = None
    ma_above: float | None = None
    ma_below: float | None = None
    lower_clip_share: float | None = None
    # clip_pi's actuator is the ratio clip's ε_high; the share of steps on which the clip bound any token
    # (clip/fraction > 0). 0 on every step: the output set a bound nothing reached (one update per batch:
    # every ratio is 1), so the run is grpo_ds's. None for the other laws.
    ratio_clip_share: float | None = None

    def held(self) -> bool:
        return (
            self.collapse is None
            and self.ma_share is not None
            and self.ma_share >= HELD_MA_SHARE
            and self.mean_deviation is not None
            and self.mean_deviation <= HELD_MAX_DEVIATION
        )


def _target(events: list[dict[str, Any]], entropies: list[tuple[int, float]], setting: Any) -> float | None:
    """The cell's target for this run: `setting` (nats or {relative: r} × H₀) when given, else what the
    run logged (entropy/target, resolved)."""
    if setting is not None:
        return an.spec_target({"algorithm": {"gate": {"target_entropy": setting}}}, entropies)
    logged = an.metric_series(events, "entropy/target") or an.metric_series(events, cm.TARGET)
    if logged:
        return logged[-1][1]
    spec: dict[str, Any] = next(
        (e["spec"] for e in events if e.get("type") == "started" and isinstance(e.get("spec"), dict)), {}
    )
    return an.spec_target(spec, entropies)  # grpo_ds: the cell's target in its gate section


def seed_row(entry: dict[str, Any], *, target_setting: Any = None, reused: bool = False) -> SeedRow:
    """The statistics of one run (an entry of collect: its summary and events)."""
    s: an.RunSummary = entry["summary"]
    events = entry["events"]
    entropies = an.metric_series(events, an.ENTROPY)
    target = _target(events, entropies, target_setting)
    held = holding(entropies, target)
    step_share = clip_share = run_noise = ma_above = ma_below = lower_clip_share = None
    if held.settling_step is not None and target is not None:
        after = [(st, h) for st, h in entropies if st >= held.settling_step]
        step_share = sum(near_target(h, target) for _, h in after) / len(after)
        run_noise = step_noise([h for _, h in after], target)
        ma = [m for (st, _), m in zip(entropies, moving_average([h for _, h in entropies]), strict=True)
              if st >= held.settling_step and m is not None]  # fmt: skip
        if ma:
            ma_above = sum(m > (1 + HOLD_TOLERANCE) * target for m in ma) / len(ma)
            ma_below = sum(m < (1 - HOLD_TOLERANCE) * target for m in ma) / len(ma)
        saturated = {
            st: v >= 0.5 for st, v in an.metric_series(events, cm.SATURATED) if st >= held.settling_step
        }
        if saturated:
            clip_share = sum(saturated.values()) / len(saturated)
            lowering = [st for st, u in an.metric_series(events, cm.OUTPUT) if saturated.get(st) and u < 0]
            lower_clip_share = len(lowering) / len(saturated)
    runs = [v for _, v in an.metric_series(events, cm.SATURATED_STEPS)]
    ratio_clip_share = None
    if _law_of(events) == "clip_pi":
        clipped = [v > 0 for _, v in an.metric_series(events, CLIP_FRACTION)]
        ratio_clip_share = sum(clipped) / len(clipped) if clipped else None
    tail = [h for _, h in entropies[-END_STEPS:]]
    end_ratio = sum(tail) / len(tail) / target if tail and target else None
    return SeedRow(
        arm=s.arm or "?",
        seed=s.seed,
        finished=s.finished,
        steps=s.steps,
        reused=reused,
        target=target,
        collapse=collapse_step(entropies),
        settling_step=held.settling_step,
        ma_share=held.ma_hold_fraction,
        mean_deviation=held.mean_abs_deviation,
        step_share=step_share,
        clip_share=clip_share,
        longest_clip=int(max(runs)) if runs else None,
        final_avg=s.final_avg,
        end_ratio=end_ratio,
        run_noise=run_noise,
        ma_above=ma_above,
        ma_below=ma_below,
        lower_clip_share=lower_clip_share,
        ratio_clip_share=ratio_clip_share,
    )


def _law_of(events: list[dict[str, Any]]) -> str | None:
    """The algorithm a run ran, from its started event's spec."""
    spec: dict[str, Any] = next(
        (e["spec"] for e in events if e.get("type") == "started" and isinstance(e.get("spec"), dict)), {}
    )
    algorithm = spec.get("algorithm")
    return algorithm.get("name") if isinstance(algorithm, dict) else None


def noise_floor_of(suite: Suite, run_root: Path | None) -> tuple[float, str] | None:
    """(relative sd of H̄, where it comes from) for the cell, or None where it has not been measured."""
    if run_root is not None:
        path = run_root / "runs" / suite.name / NOISE_FILE
        if path.is_file():
            data = json.loads(path.read_text())
            return float(data["relative_sd"]), f"{path.name}: {int(data.get('samples', 0))} re-samples"
    return MEASURED_FLOORS.get(suite.name)


def cell_extras(suite: Suite, root: Path, baseline_root: Path | None) -> dict[str, Any]:
    """What a cell's section needs beyond its own runs: the cell's target, the noise floor, and the reused
    SmolLM2-suite runs (grpo_ds, and at 0.7 × H₀ stare_o1 and adaptive_entropy) at the cell's rate."""
    from experiments.control_suite import cell_target, reused_baseline
    from experiments.runner import RESULT_FILE, events_of, read_json, run_dir

    out: dict[str, Any] = {
        "target_setting": cell_target(suite.name),
        "noise_floor": noise_floor_of(suite, root),
    }
    reused = reused_baseline(suite.name)
    if reused is None:
        return out
    base_suite, arms = reused
    where = baseline_root if baseline_root is not None else root.parent / "smollm2"
    found: list[dict[str, Any]] = []
    for run in base_suite.runs:
        if run.arm not in arms:
            continue
        events = events_of(run_dir(where, run))
        if not events:
            continue
        result = read_json(run_dir(where, run) / RESULT_FILE) or {}
        summary = an.summarize_run(
            run.id, events, arm=run.arm, seed=run.seed, threads=run.threads,
            warmup_steps=base_suite.warmup_steps, collapse_streak=base_suite.collapse_steps,
            wall_seconds=result.get("wall_seconds"), plan_spec=run.spec,
        )  # fmt: skip
        found.append({"summary": summary, "events": events})
    summaries: list[an.RunSummary] = [e["summary"] for e in found]
    seeds = sorted({s.seed for s in summaries if s.arm == BASELINE})
    out["baseline"] = found
    out["baseline_source"] = (
        f"**Reused runs** (not rerun; same task, seeds and learning rate): {', '.join(arms)} from "
        f"{where / 'runs' / base_suite.name} ({BASELINE} seeds found: {', '.join(map(str, seeds)) or 'none'}); "
        "their holding is measured against this cell's target."
    )
    return out


def _f(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f} %"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def rows_of(entry: dict[str, Any]) -> list[SeedRow]:
    """Every run of the cell, then the reused baseline runs (measured against the cell's target)."""
    suite: Suite = entry["suite"]
    out = [seed_row(r) for r in entry["runs"]]
    setting = entry.get("target_setting")
    out += [seed_row(r, target_setting=setting, reused=True) for r in entry.get("baseline", [])]
    order = {arm: i for i, arm in enumerate(suite.arms)}
    return sorted(out, key=lambda r: (r.reused, order.get(r.arm, len(order)), r.arm, r.seed))


def seed_table(rows: list[SeedRow]) -> str:
    body = []
    for r in rows:
        status = "finished" if r.finished else f"running (step {r.steps})"
        clip = "–"
        if r.clip_share is not None:
            lower = "" if r.lower_clip_share is None else f"lowering side {_pct(r.lower_clip_share)}; "
            clip = f"{_pct(r.clip_share)} ({lower}longest {r.longest_clip})"
        out_of_band = "–" if r.ma_above is None else f"{_pct(r.ma_above)} / {_pct(r.ma_below)}"
        body.append(
            [
                r.arm + (" (reused)" if r.reused else ""),
                str(r.seed),
                status,
                _f(r.target),
                f"yes, step {r.collapse}" if r.collapse is not None else "no",
                str(r.settling_step) if r.settling_step is not None else "never",
                _pct(r.ma_share),
                _f(r.mean_deviation),
                _pct(r.step_share),
                out_of_band,
                _f(r.run_noise),
                clip,
                "–" if r.end_ratio is None else f"{r.end_ratio:.2f}",
                _f(r.final_avg),
            ]
        )
    header = ["arm", "seed", "status", "target (nats)", "collapsed", "settling step", "5-step MA in band"]
    header += ["mean abs H − H* / H*", "per-step share (same steps)", "MA above / below the band"]
    header += ["step noise in the run (rel.)", "at the clip"]
    header += [f"H̄ at the end / H* (last {END_STEPS} steps)", "final avg@k"]
    return _table(header, body)


def accuracy_cost(rows: list[SeedRow]) -> dict[str, an.PairedDiff]:
    """Per arm (not grpo_ds): final avg@k minus grpo_ds's, paired by seed, finished runs only."""
    base = {r.seed: r.final_avg for r in rows if r.arm == BASELINE and r.finished and r.final_avg is not None}
    out = {}
    for arm in dict.fromkeys(r.arm for r in rows if r.arm != BASELINE):
        pairs = [
            (r.final_avg, base[r.seed])
            for r in rows
            if r.arm == arm and r.finished and r.final_avg is not None and r.seed in base
        ]
        out[arm] = an.paired_difference("final_avg", pairs)
    return out


def _cost_words(d: an.PairedDiff | None) -> str:
    if d is None or d.n == 0:
        return "no paired seed yet"
    words = f"{d.mean:+.3f} [{_f(d.low)}, {_f(d.high)}], n = {d.n}"
    if d.n < 3:
        return words + " (fewer than 3 seeds: not judged)"
    if d.significant and d.mean is not None:
        return words + (": significantly lower" if d.mean < 0 else ": significantly higher")
    return words + ": not significantly different"


def _misses(rows: list[SeedRow]) -> list[str]:
    """By how much the finished seeds missed "held"."""
    out = []
    collapsed = [r for r in rows if r.collapse is not None]
    if collapsed:
        out.append(f"collapsed on {len(collapsed)}/{len(rows)} seeds")
    never = [r.seed for r in rows if r.settling_step is None]
    if never:
        out.append("never settled (seed " + ", ".join(map(str, never)) + ")")
    shares = [r for r in rows if r.ma_share is not None]
    if shares:
        worst = min(shares, key=lambda r: r.ma_share or 0.0)
        if worst.ma_share is not None and worst.ma_share < HELD_MA_SHARE:
            out.append(
                f"MA share {_pct(worst.ma_share)} on seed {worst.seed}, "
                f"{100 * (HELD_MA_SHARE - worst.ma_share):.0f} points short of {_pct(HELD_MA_SHARE)}"
            )
    devs = [r for r in rows if r.mean_deviation is not None]
    if devs:
        worst = max(devs, key=lambda r: r.mean_deviation or 0.0)
        if worst.mean_deviation is not None and worst.mean_deviation > HELD_MAX_DEVIATION:
            out.append(
                f"mean deviation {_f(worst.mean_deviation)} on seed {worst.seed}, "
                f"{_f(worst.mean_deviation - HELD_MAX_DEVIATION)} over {HELD_MAX_DEVIATION}"
            )
    return out


def _span(values: list[float], pct: bool = False) -> str:
    lo, hi = min(values), max(values)
    if pct:
        return _pct(lo) if round(100 * lo) == round(100 * hi) else f"{100 * lo:.0f}–{100 * hi:.0f} %"
    return f"{lo:.3f}" if f"{lo:.3f}" == f"{hi:.3f}" else f"{lo:.3f}–{hi:.3f}"


def _why(rows: list[SeedRow], floor: tuple[float, str] | None) -> str:
    """The measured reasons a miss can have: the moving average leaving the band on one side (with the law's
    output at its lowering clip), a saturated actuator, the step noise in the run, the noise floor."""
    parts = []
    inert = [r for r in rows if r.ratio_clip_share == 0.0]
    if inert:
        parts.append(
            "the ratio clip bound no token on any step (clip/fraction 0) on seed "
            + ", ".join(str(r.seed) for r in inert)
            + ": with one update per batch every ratio is 1, so ε_high, the law's output, had no effect and "
            "the run is grpo_ds's (clip_pi now needs optim.ppo_epochs ≥ 2)"
        )
    short = [
        r for r in rows if r.ma_share is not None and r.ma_share < HELD_MA_SHARE and r.ma_above is not None
    ]
    if short:
        parts.append(
            f"where the MA share fell short (seed {', '.join(str(r.seed) for r in short)}) the moving average "
            f"was above the band on {_span([r.ma_above or 0.0 for r in short], True)} of the steps and below it "
            f"on {_span([r.ma_below or 0.0 for r in short], True)}"
        )
        lowering = [r.lower_clip_share for r in short if r.lower_clip_share is not None]
        if lowering:
            parts[-1] += f", with the output at its lowering clip on {_span(lowering, True)}"
    noisy = [r for r in rows if r.run_noise is not None and r.mean_deviation is not None]
    if any((r.mean_deviation or 0.0) > HELD_MAX_DEVIATION for r in noisy):
        reaches = [NOISE_REACH * (r.run_noise or 0.0) for r in noisy]
        within = [r.seed for r, x in zip(noisy, reaches, strict=True) if x >= HELD_MAX_DEVIATION]
        parts.append(
            f"step noise in the run {_span([r.run_noise or 0.0 for r in noisy])} of the target, so a law that "
            f"followed the level exactly would still deviate by about {_span(reaches)}"
            + (
                f": the {HELD_MAX_DEVIATION} bound is within the run's own noise on seed "
                + ", ".join(map(str, within))
                if within
                else f": below the {HELD_MAX_DEVIATION} bound on every seed"
            )
        )
    saturated = [
        r for r in rows if r.longest_clip is not None and r.longest_clip >= cm.SATURATION_ALERT_STEPS
    ]
    if saturated:
        parts.append(
            "actuator saturated (≥ 20 steps at its clip) on seed "
            + ", ".join(f"{r.seed} ({r.longest_clip} steps)" for r in saturated)
        )
    if floor is not None:
        reach = NOISE_REACH * floor[0]
        if reach < HELD_MAX_DEVIATION:
            parts.append(
                f"noise floor {floor[0]:.3f} (the policy at the start, re-sampled; out of reach below "
                f"{reach:.3f}): on its own under the {HELD_MAX_DEVIATION} bound"
            )
        else:
            parts.append(
                f"noise floor {floor[0]:.3f} (the policy at the start, re-sampled): the {HELD_MAX_DEVIATION} "
                "bound is within the sampling noise"
            )
    return "; ".join(parts)


def _ratio_range(rows: list[SeedRow]) -> str:
    ratios = [r.end_ratio for r in rows if r.end_ratio is not None]
    return f"{min(ratios):.2f}–{max(ratios):.2f} ×" if ratios else "–"


def _why_cost(arm_rows: list[SeedRow], base_rows: list[SeedRow]) -> str:
    """Where the entropy of an arm that held at an accuracy cost ended, beside grpo_ds's: a baseline that
    ends well below the target without collapsing says the task learns at lower entropy than the target."""
    collapsed = sum(r.collapse is not None for r in base_rows)
    return (
        f"entropy at the end (mean H̄ of the last {END_STEPS} steps over the target): {arm_rows[0].arm} "
        f"{_ratio_range(arm_rows)}, {BASELINE} {_ratio_range(base_rows)} ({collapsed} of {len(base_rows)} "
        "seeds collapsed)"
    )


def verdicts(suite: Suite, rows: list[SeedRow], floor: tuple[float, str] | None) -> list[list[str]]:
    """Per arm of the cell: held (with the accuracy cost) or by how much it missed, and why."""
    planned = {arm: sum(1 for r in suite.runs if r.arm == arm) for arm in suite.arms}
    costs = accuracy_cost(rows)
    out = []
    for arm in dict.fromkeys([*suite.arms, *(r.arm for r in rows)]):
        done = [r for r in rows if r.arm == arm and r.finished]
        expected = planned.get(arm) or len({r.seed for r in rows if r.arm == arm})
        if not done and not expected:
            continue
        misses = _misses(done)
        cost = costs.get(arm)
        if len(done) < expected:
            verdict = f"not yet known ({len(done)} of {expected} seeds finished)"
            if misses:
                verdict += ": missed so far: " + "; ".join(misses)
        elif misses:
            verdict = "missed: " + "; ".join(misses)
        elif cost is not None and cost.significant and cost.mean is not None and cost.mean < 0:
            verdict = "held entropy at an accuracy cost (significantly below grpo_ds): does not count as held"
        else:
            verdict = "held"
        why = _why(done, floor) if misses else ""
        if verdict.startswith("held entropy at an accuracy cost"):
            why = _why_cost(done, [r for r in rows if r.arm == BASELINE and r.finished])
        reused = any(r.reused for r in rows if r.arm == arm)
        out.append(
            [
                arm + (" (reused)" if reused else ""),
                verdict,
                why or "–",
                "(the comparison)" if arm == BASELINE else _cost_words(cost),
            ]
        )
    return out


def suite_markdown(entry: dict[str, Any]) -> str:
    suite: Suite = entry["suite"]
    rows = rows_of(entry)
    floor = entry.get("noise_floor")
    parts = [f"### {suite.title}", "", suite.description, ""]
    parts += [
        line.replace(
            "the tables cover the finished runs only.",
            "a run that has not finished is listed per seed, marked; the verdicts and the paired differences "
            "cover the finished runs only.",
        )
        for line in progress_lines(suite, entry["runs"])
    ]
    if entry.get("baseline_source"):
        parts += ["", entry["baseline_source"]]
    parts += [
        "",
        "**Noise floor**: "
        + (
            f"relative sd of H̄ {floor[0]:.3f} ({floor[1]}); a mean |H − H*|/H* below about "
            f"{NOISE_REACH} × that ({NOISE_REACH * floor[0]:.3f}) is out of reach for any controller."
            if floor is not None
            else "not measured for this cell."
        ),
    ]
    if not rows:
        return "\n".join([*parts, "", "_No run of this cell has logged a step yet._", ""])
    parts += ["", "**Holding per seed** (contract/stability.py):", "", seed_table(rows)]
    parts += [
        "",
        f"**Verdict per arm** (held: on every seed no collapse, ≥ {_pct(HELD_MA_SHARE)} of the post-settling "
        f"steps with the 5-step moving average within ±25 % of the target, mean |H − H*|/H* ≤ "
        f"{HELD_MAX_DEVIATION}; a law that holds entropy at a significant accuracy cost does not count; "
        "accuracy cost: final avg@k − grpo_ds's, paired by seed, mean [95 % t interval], n seeds):",
        "",
        _table(
            ["arm", "verdict", "why (measured)", "accuracy cost vs grpo_ds"], verdicts(suite, rows, floor)
        ),
        "",
    ]
    return "\n".join(parts)
