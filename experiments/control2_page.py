"""The second-generation law's page (docs/RESULTS-control2.md): per cell of experiments/control2_suite.py, per
arm and seed, what the issue's acceptance reads, from the runs' events alone.

- `hold`: collapse, the settling step, the 5-step moving average's share in ±25 % of the target from it on,
  its mean |M − H*|/H* and its largest excursion above the target, the shares of those steps above and
  below the band, the law's output at a clip (saturation) and held by the rate limit; "held" when every
  bound of the acceptance is met (`HoldBounds`), else by how much it missed.
- `floor`: collapse, the share of steps the law acted (u > 0), where the run's entropy ended.
- every arm: final avg@k, and against grpo_ds on the same seeds a paired difference with a 95 % t interval
  (experiments/analysis.py).
- ctl2-x4 beside ctl2-t1.0's `hold` (and ctl2-r2-x4 beside ctl2-r2-t1.0's): the same statistics at 4 × the
  samples, over the steps both runs have; each `hold` seed beside its noise floor (what a perfect law would
  show at the run's measured step noise).

Usage: python -m experiments.control2_page RUNS_ROOT [--md docs/RESULTS-control2.md]
RUNS_ROOT holds SUITE/ARM/seedN/events.jsonl (or events.jsonl.gz), as `python -m experiments run --root`
writes them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.control import pi as law
from contract.control import split
from contract.stability import HOLD_TOLERANCE, MA_WINDOW, collapse_step, holding, moving_average, step_noise
from experiments import analysis as an

EVAL = "eval/avg@k"


@dataclass(frozen=True)
class HoldBounds:
    """The acceptance's bounds for `hold` (issue 48): every one must hold on every seed of a cell."""

    settling: int = 15
    ma_share: float = 0.95
    ma_deviation: float = 0.08
    excursion: float = 0.25


BOUNDS = HoldBounds()


@dataclass(frozen=True)
class Row:
    suite: str
    arm: str
    seed: int
    steps: int
    finished: bool
    target: float | None
    collapse: int | None
    settling: int | None
    ma_share: float | None
    ma_deviation: float | None
    excursion: float | None
    above: float | None
    below: float | None
    saturated: float | None  # share of steps with the law's output at a clip
    rate_held: float | None  # share of steps the rate limit held the output
    acting: float | None  # share of steps with u > 0 (floor)
    end_ratio: float | None  # mean H̄ of the last 10 steps over the target
    start_avg: float | None
    final_avg: float | None
    cpu: str | None = None  # the CPU the run ran on (its result.json)
    noise: float | None = None  # the batch entropy's step noise from settling on, over the target
    series: tuple[tuple[int, float], ...] = ()  # (step, H̄) of every step, for comparisons over equal spans

    def missed(self) -> list[str]:
        """The hold bounds this run missed, each with its figure."""
        if self.collapse is not None:
            return [f"collapsed at step {self.collapse}"]
        if self.settling is None:
            return ["never settled"]
        out = []
        if self.settling > BOUNDS.settling:
            out.append(f"settled at step {self.settling}")
        if (self.ma_share or 0) < BOUNDS.ma_share:
            out.append(f"MA in band {self.ma_share:.0%}")
        if (self.ma_deviation or 0) > BOUNDS.ma_deviation:
            out.append(f"MA deviation {self.ma_deviation:.3f}")
        if (self.excursion or 0) > BOUNDS.excursion:
            out.append(f"excursion +{self.excursion:.0%}")
        return out


def noise_floor_of_holding(noise: float) -> tuple[float, float]:
    """What a perfect law would show at a run's measured step noise σ (relative to the target): with the batch
    entropy the target plus white noise, M is normal with sd σ/√5, so mean |M − H*|/H* = σ/√5 · √(2/π) and M's
    share in ±25 % is erf(0.25 / (σ/√5) / √2). (deviation, band share)."""
    sd = noise / math.sqrt(MA_WINDOW)
    if sd <= 0:
        return 0.0, 1.0
    return sd * math.sqrt(2 / math.pi), math.erf(HOLD_TOLERANCE / sd / math.sqrt(2))


def read_events(folder: Path) -> list[dict[str, Any]]:
    plain, packed = folder / "events.jsonl", folder / "events.jsonl.gz"
    text = plain.read_text() if plain.exists() else gzip.decompress(packed.read_bytes()).decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _target(events: list[dict[str, Any]]) -> float | None:
    logged = an.metric_series(events, "entropy/target")
    if logged:
        return logged[-1][1]
    spec: dict[str, Any] = next(
        (e["spec"] for e in events if e.get("type") == "started" and isinstance(e.get("spec"), dict)), {}
    )
    return an.spec_target(spec, an.metric_series(events, an.ENTROPY))


def _share(values: list[float], test: Any) -> float | None:
    return sum(1 for v in values if test(v)) / len(values) if values else None


def row_of(suite: str, arm: str, seed: int, folder: Path, steps_planned: int) -> Row:
    events = read_events(folder)
    entropies = an.metric_series(events, an.ENTROPY)
    target = _target(events)
    held = holding(entropies, target)
    above = below = None
    if held.settling_step is not None and target:
        ma = [m for m in moving_average([h for _, h in entropies])[held.settling_step - 1 :] if m is not None]
        above = _share(ma, lambda m: m > (1 + HOLD_TOLERANCE) * target)
        below = _share(ma, lambda m: m < (1 - HOLD_TOLERANCE) * target)
    outputs = [v for _, v in an.metric_series(events, law.OUTPUT)]
    rate = [v for _, v in an.metric_series(events, "control/rate_limited")]
    evals = an.eval_series(events, EVAL)
    last = [h for _, h in entropies[-10:]]
    settled = [h for s, h in entropies if held.settling_step is None or s >= held.settling_step]
    return Row(
        suite,
        arm,
        seed,
        len(entropies),
        (folder / "result.json").exists() and len(entropies) >= steps_planned,
        target,
        collapse_step(entropies),
        held.settling_step,
        held.ma_hold_fraction,
        held.ma_mean_abs_deviation,
        held.ma_max_excursion,
        above,
        below,
        _share([v for _, v in an.metric_series(events, law.SATURATED)], lambda v: v > 0.5),
        _share(rate, lambda v: v > 0.5),
        _share(outputs, lambda v: v > 0) if outputs else None,
        statistics.fmean(last) / target if last and target else None,
        evals[0][1] if evals and evals[0][0] == 0 else None,
        evals[-1][1] if evals and evals[-1][0] > 0 else None,
        _cpu(folder),
        step_noise(settled, target) if target else None,
        tuple(entropies),
    )


def _cpu(folder: Path) -> str | None:
    try:
        cpu = json.loads((folder / "result.json").read_text()).get("cpu") or {}
    except (OSError, ValueError):
        return None
    wide = "AVX-512" if "avx512f" in cpu.get("vector_extensions", []) else "AVX2"
    return f"{cpu.get('model', '?')} ({wide})"


def collect(root: Path, steps_of: dict[str, int]) -> list[Row]:
    rows = []
    for suite_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("ctl2-")):
        for arm_dir in sorted(p for p in suite_dir.iterdir() if p.is_dir()):
            for seed_dir in sorted(arm_dir.glob("seed*")):
                if (seed_dir / "events.jsonl").exists() or (seed_dir / "events.jsonl.gz").exists():
                    seed = int(seed_dir.name.removeprefix("seed"))
                    rows.append(
                        row_of(suite_dir.name, arm_dir.name, seed, seed_dir, steps_of.get(suite_dir.name, 0))
                    )
    return rows


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "–" if x is None else fmt.format(x)


def _pct(x: float | None) -> str:
    return _f(x, "{:.0%}")


def cost(rows: list[Row], arm: str) -> an.PairedDiff:
    """arm's final avg@k minus grpo_ds's, paired by seed over the finished runs of both."""
    base = {
        r.seed: r.final_avg for r in rows if r.arm == "grpo_ds" and r.finished and r.final_avg is not None
    }
    pairs = [(r.final_avg, base[r.seed]) for r in rows if r.arm == arm and r.finished and r.seed in base]
    return an.paired_difference(EVAL, [(a, b) for a, b in pairs if a is not None])


def _cost_text(d: an.PairedDiff) -> str:
    if d.mean is None:
        return "no paired seed yet"
    interval = "" if d.low is None else f" [{d.low:+.3f}, {d.high:+.3f}]"
    verdict = " (significant)" if d.significant else " (not significant)" if d.n >= 3 else ""
    return f"{d.mean:+.3f}{interval}, n = {d.n}{verdict}"


def descent_step(series: tuple[tuple[int, float], ...], target: float) -> int | None:
    """The first step whose 5-step moving average is within +25 % of the target (from above)."""
    ma = moving_average([h for _, h in series])
    return next(
        (s for (s, _), m in zip(series, ma, strict=True) if m is not None and m <= 1.25 * target), None
    )


def _descent_text(rows: list[Row]) -> str:
    """Where `hold` settled late: the step grpo_ds's own entropy came down to the band on the same seed (the
    law does not lower before the entropy first reaches the target: arming, docs/ALGORITHMS.md §12.1)."""
    late = [r for r in rows if r.arm == "hold" and r.finished and (r.settling or 0) > BOUNDS.settling]
    base = {r.seed: r for r in rows if r.arm == "grpo_ds" and r.finished}
    pairs = [(r, base[r.seed]) for r in sorted(late, key=lambda r: r.seed) if r.seed in base and r.target]
    if not pairs:
        return ""
    return (
        "- settled late: grpo_ds's own moving average first came within +25 % of the target at "
        + ", ".join(
            f"step {descent_step(b.series, h.target or 0.0) or '–'} (seed {h.seed}, `hold` settled at {h.settling})"
            for h, b in pairs
        )
        + "; the law does not lower before the entropy first reaches the target (arming)."
    )


def _floor_text(r: Row) -> str:
    deviation, share = noise_floor_of_holding(r.noise or 0.0)
    return (
        f"seed {r.seed}: σ {r.noise:.3f}, MA deviation ≥ {deviation:.3f} (measured {_f(r.ma_deviation)}), "
        f"in band ≤ {share:.0%} (measured {_pct(r.ma_share)})"
    )


HEADER = (
    "| arm | seed | steps | collapse | settled | MA in band | MA deviation | excursion | above / below | "
    "saturated | rate-held | u > 0 | end / target | avg@k start → end |"
)


# A second-round suite (experiments/control2_suite.py SECOND) reuses its cell's first-round grpo_ds runs.
SECOND = "ctl2-r2-"


def _baseline(suite: str) -> str | None:
    """The suite whose grpo_ds runs `suite`'s arms are set against, where it is another one."""
    return "ctl2-" + suite.removeprefix(SECOND) if suite.startswith(SECOND) else None


def cell_markdown(suite: str, rows: list[Row]) -> str:
    """A cell's table and verdicts; rows may hold the grpo_ds runs of its baseline suite (a second round)."""
    base_suite = _baseline(suite)
    if base_suite is not None:
        rows = [
            r
            for r in rows
            if (r.suite == base_suite) == (r.arm == "grpo_ds") and r.suite in (suite, base_suite)
        ]
    lines = [f"### {suite}", "", HEADER, "|" + "---|" * 14]
    for r in sorted(rows, key=lambda r: (r.arm != "grpo_ds", r.arm, r.seed)):
        mark = "" if r.finished else " (running)"
        lines.append(
            f"| {r.arm} | {r.seed} | {r.steps}{mark} | {r.collapse or '–'} | {r.settling or '–'} | "
            f"{_pct(r.ma_share)} | {_f(r.ma_deviation)} | {_f(r.excursion, '{:+.0%}')} | "
            f"{_pct(r.above)} / {_pct(r.below)} | {_pct(r.saturated)} | {_pct(r.rate_held)} | {_pct(r.acting)} | "
            f"{_f(r.end_ratio, '{:.2f}')} | {_f(r.start_avg)} → {_f(r.final_avg)} |"
        )
    lines.append("")
    for arm in ("hold", "floor"):
        arm_rows = [r for r in rows if r.arm == arm and r.finished]
        if not arm_rows:
            continue
        collapses = sum(r.collapse is not None for r in arm_rows)
        text = f"- `{arm}`: {len(arm_rows)} finished run(s), {collapses} collapsed; avg@k against grpo_ds "
        text += _cost_text(cost(rows, arm))
        if arm == "hold":
            misses = {r.seed: r.missed() for r in arm_rows if r.missed()}
            text += (
                "; held on every seed"
                if not misses
                else "; missed: " + "; ".join(f"seed {s}: {', '.join(m)}" for s, m in sorted(misses.items()))
            )
            lines.append(text + ".")
            text = (
                "- `hold`'s noise floor (a perfect law at each seed's measured step noise σ): "
                + "; ".join(
                    _floor_text(r) for r in sorted(arm_rows, key=lambda r: r.seed) if r.noise is not None
                )
            )
        lines.append(text + ".")
    late = _descent_text(rows)
    if late:
        lines.append(late)
    base = [r for r in rows if r.arm == "grpo_ds" and r.finished]
    if base:
        whose = f" ({base_suite}'s runs)" if base_suite else ""
        lines.append(
            f"- grpo_ds{whose}: {sum(r.collapse is not None for r in base)} of {len(base)} collapsed."
        )
    return "\n".join(lines) + "\n"


# The 4 × samples cell and the cell it repeats at 4 × the samples per step (issue 48, item 5).
SAMPLES_PAIRS = (("ctl2-t1.0", "ctl2-x4"), ("ctl2-r2-t1.0", "ctl2-r2-x4"))


@dataclass(frozen=True)
class Figures:
    """A run's holding figures over a span of its steps (the 4 × samples comparison)."""

    settling: int | None
    ma_share: float | None
    ma_deviation: float | None
    excursion: float | None
    noise: float | None


def figures(series: tuple[tuple[int, float], ...], target: float | None) -> Figures:
    held = holding(list(series), target)
    settled = [h for s, h in series if held.settling_step is None or s >= held.settling_step]
    noise = step_noise(settled, target) if target else None
    return Figures(held.settling_step, held.ma_hold_fraction, held.ma_mean_abs_deviation, held.ma_max_excursion,
                   noise)  # fmt: skip


# Below this many steps a running 4 × run is not compared yet.
MIN_COMPARED_STEPS = 30


def samples_markdown(rows: list[Row], pair: tuple[str, str] = SAMPLES_PAIRS[0]) -> str:
    """`hold` on the same seeds at 1 × and 4 × the samples: the batch entropy's step noise and the moving
    average's holding figures side by side, over the steps both runs have (a 4 × run still running is compared
    over its steps so far, and says so), with the ratio of the means."""
    base = {r.seed: r for r in rows if r.suite == pair[0] and r.arm == "hold" and r.finished}
    more = {
        r.seed: r
        for r in rows
        if r.suite == pair[1] and r.arm == "hold" and (r.finished or r.steps >= MIN_COMPARED_STEPS)
    }
    seeds = sorted(set(base) & set(more))
    if not seeds:
        return ""
    lines = [
        f"### 4 × the samples: {pair[0]} `hold` (32 responses a step) beside {pair[1]} (128)",
        "",
        "| seed | steps compared | step noise 1× → 4× | MA deviation 1× → 4× | MA in band 1× → 4× | "
        "excursion 1× → 4× | settled 1× → 4× |",
        "|" + "---|" * 7,
    ]
    one: dict[int, Figures] = {}
    four: dict[int, Figures] = {}
    for s in seeds:
        n = min(len(base[s].series), len(more[s].series))
        a = one[s] = figures(base[s].series[:n], base[s].target)
        b = four[s] = figures(more[s].series[:n], more[s].target)
        running = "" if more[s].finished else " (4 × still running)"
        lines.append(
            f"| {s} | 1–{n}{running} | {_f(a.noise)} → {_f(b.noise)} | {_f(a.ma_deviation)} → "
            f"{_f(b.ma_deviation)} | {_pct(a.ma_share)} → {_pct(b.ma_share)} | {_f(a.excursion, '{:+.0%}')} → "
            f"{_f(b.excursion, '{:+.0%}')} | {a.settling or '–'} → {b.settling or '–'} |"
        )
    lines.append("")
    cpus = sorted({r.cpu for r in (*base.values(), *more.values()) if r.seed in seeds and r.cpu})
    lines.append(
        f"- CPUs: {'; '.join(cpus)} (step noise: √(mean squared step-to-step change / 2) / H* from settling on)."
    )
    for label, field in (("step noise", "noise"), ("MA deviation", "ma_deviation")):
        x = [v for s in seeds if (v := getattr(one[s], field)) is not None]
        y = [v for s in seeds if (v := getattr(four[s], field)) is not None]
        if x and y and statistics.fmean(x) > 0:
            ratio = statistics.fmean(y) / statistics.fmean(x)
            lines.append(
                f"- {label}: mean {statistics.fmean(x):.3f} at 1 ×, {statistics.fmean(y):.3f} at 4 × "
                f"(ratio {ratio:.2f}; a figure made of sampling noise alone would halve: 0.50), {len(seeds)} seed(s)."
            )
    return "\n".join(lines) + "\n"


def _settings(values: dict[str, float]) -> str:
    return ", ".join(f"{k} {values[k]:g}" for k in ("kp", "ki", "filter", "rate"))


def _second() -> dict[str, float]:
    fields = split.SplitSettings.model_fields
    return {k: float(fields[k].default) for k in split.FIRST_DEFAULTS}


def page(rows: list[Row]) -> str:
    b = BOUNDS
    out = [
        "# Results: the second-generation entropy law (`entropy_split`)",
        "",
        "Generated by `python -m experiments.control2_page RUNS_ROOT` from the runs' events; the cells and why "
        "they were chosen: experiments/control2_suite.py and docs/ALGORITHMS.md §12. `hold` is held on a seed "
        f"when it does not collapse, settles by step {b.settling}, keeps the 5-step moving average M within "
        f"±25 % of the target on ≥ {b.ma_share:.0%} of the steps from then on, with mean |M − H*|/H* ≤ "
        f"{b.ma_deviation} and M never more than {b.excursion:.0%} above the target. Saturated: the law's output "
        "at a clip; rate-held: held by its rate limit; u > 0: the bonus acting (floor's only side).",
        "",
        f"Two rounds: `ctl2-CELL` ran the law's first defaults ({_settings(split.FIRST_DEFAULTS)}); "
        f"`{SECOND}CELL` runs the cell again with the second, committed defaults ({_settings(_second())}), set "
        "against the first round's grpo_ds runs of the cell (grpo_ds does not read the law's settings).",
        "",
    ]
    for suite in sorted({r.suite for r in rows}):
        out.append(cell_markdown(suite, [r for r in rows if r.suite == suite or r.suite == _baseline(suite)]))
    out.extend(text for pair in SAMPLES_PAIRS if (text := samples_markdown(rows, pair)))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.control2_page", description=__doc__)
    parser.add_argument("root", type=Path)
    parser.add_argument("--md", type=Path, default=None)
    args = parser.parse_args(argv)
    from experiments.control2_suite import OPTIONAL

    steps_of = {
        name: int(make().runs[0].spec.get("optim", {}).get("steps", 100)) for name, make in OPTIONAL.items()
    }
    text = page(collect(args.root, steps_of))
    if args.md is None:
        print(text)
    else:
        args.md.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
