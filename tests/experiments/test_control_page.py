"""The control page (experiments/control_page.py) on synthetic run folders: holding per seed (collapse, the
settling step, the moving average's share, the mean deviation, the per-step share, the clip), the noise
floor, the verdict per arm (held; missed, by how much and why; held at an accuracy cost, which does not
count), the accuracy cost paired by seed with grpo_ds from the SmolLM2 suite's folders, and the page command."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from experiments import __main__ as cli
from experiments import control_page as cp
from experiments.control_suite import control_suite
from experiments.page import collect, suite_markdown

SEEDS = (0, 1, 2)
STEPS = 30
H0 = 1.0
TARGET = 0.7  # control-tune's 0.7 × H₀


def held_profile(step: int) -> float:
    """From H₀ down to the target by step 5, then ±0.02 around it."""
    if step <= 5:
        return (1.0, 0.9, 0.8, 0.75, 0.7)[step - 1]
    return TARGET + (0.02 if step % 2 else -0.02)


def noisy_profile(step: int) -> float:
    """The same descent, then ±0.3 × target around it: the moving average stays in band, the raw H̄ not."""
    if step <= 5:
        return held_profile(step)
    return TARGET * (1.3 if step % 2 else 0.7)


def collapsing_profile(step: int) -> float:
    return max(0.1, 1.0 - 0.2 * (step - 1))


def _events(
    profile: Any,
    final: float,
    *,
    law: bool = True,
    finished: bool = True,
    clip_from: int | None = None,
    clip_output: float = 1.0,
) -> list[dict[str, Any]]:
    spec = {"algorithm": {"name": "entropy_pi" if law else "grpo_ds"}}
    if not law:
        spec["algorithm"]["gate"] = {"target_entropy": {"relative": 0.7}}
    events: list[dict[str, Any]] = [{"type": "started", "spec": spec}]
    for step in range(1, STEPS + 1):
        metrics: dict[str, float] = {"entropy/mean": profile(step)}
        if law:
            at_clip = clip_from is not None and step >= clip_from
            metrics |= {
                "entropy/target": TARGET,
                "control/output": clip_output if at_clip else 0.3,
                "control/saturated": float(at_clip),
                "control/saturated_steps": float(step - clip_from + 1 if at_clip and clip_from else 0),
            }
        events.append({"type": "step", "step": step, "metrics": metrics})
    if finished:
        events.append({"type": "eval", "step": STEPS, "metrics": {"eval/avg@k": final, "eval/k": 2.0}})
        events.append({"type": "finished", "step": STEPS})
    return events


def _write(folder: Path, events: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


GRPO_FINAL = (0.70, 0.72, 0.74)
DEFAULT_FINAL = (0.71, 0.72, 0.75)  # +0.01, 0, +0.01: no accuracy cost
STARE_FINAL = (0.50, 0.53, 0.55)  # −0.20, −0.19, −0.19: significantly lower


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """results/control with control-tune runs, results/smollm2 with the lr 2e-5 suite's grpo_ds runs."""
    control, smollm2 = tmp_path / "results" / "control", tmp_path / "results" / "smollm2"
    cell = control / "runs" / "control-tune"
    for seed in SEEDS:
        _write(cell / "default" / f"seed{seed}", _events(held_profile, DEFAULT_FINAL[seed]))
        _write(cell / "stare_pi" / f"seed{seed}", _events(held_profile, STARE_FINAL[seed]))
        clip = 8 if seed == 1 else None  # seed 1 sits at its clip from step 8 to the end (23 steps)
        _write(cell / "clip_pi" / f"seed{seed}", _events(noisy_profile, 0.7, clip_from=clip))
        base = smollm2 / "runs" / "smollm2-add-lr2e-5" / "grpo_ds" / f"seed{seed}"
        _write(base, _events(collapsing_profile, GRPO_FINAL[seed], law=False))
    _write(cell / "stare_pi_c2" / "seed0", _events(held_profile, 0.7, finished=False))
    return control, smollm2


def _entry(control: Path, name: str = "control-tune") -> dict[str, Any]:
    return dict(collect(control, [control_suite(name)])["suites"][0])


def _table_rows(md: str, first_header: str) -> list[list[str]]:
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    out = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        out.append([c.strip() for c in line.strip("|").split("|")])
    return out


def test_holding_per_seed_by_hand(roots: tuple[Path, Path]) -> None:
    rows = {(r.arm, r.seed): r for r in cp.rows_of(_entry(roots[0]))}
    held = rows[("default", 0)]
    # The moving average enters ±25 % of 0.7 at step 5 (mean of 1.0, 0.9, 0.8, 0.75, 0.7 = 0.83 ≤ 0.875).
    assert (held.settling_step, held.collapse, held.finished) == (5, None, True)
    assert held.ma_share == 1.0 and held.step_share == 1.0
    assert held.mean_deviation == pytest.approx((0.0 + 25 * 0.02 / TARGET) / 26)
    assert held.held()
    noisy = rows[("clip_pi", 1)]
    assert noisy.ma_share == 1.0 and noisy.mean_deviation == pytest.approx(25 * 0.3 / 26)
    assert noisy.step_share == pytest.approx(1 / 26)  # only step 5's raw H̄ lies in the band
    assert noisy.clip_share == pytest.approx(23 / 26) and noisy.longest_clip == 23
    assert noisy.lower_clip_share == 0.0  # at its raising clip (output +1)
    # The step noise: post-settling H̄ steps 5..30 are 0.7, then 0.49/0.91 alternating (25 differences, the
    # first 0.21, the rest 0.42), relative to the target.
    assert noisy.run_noise == pytest.approx(math.sqrt((0.21**2 + 24 * 0.42**2) / 25 / 2) / TARGET)
    assert held.run_noise == pytest.approx(math.sqrt((0.02**2 + 24 * 0.04**2) / 25 / 2) / TARGET)
    assert (held.ma_above, held.ma_below) == (0.0, 0.0)
    assert not noisy.held()
    # grpo_ds comes from the SmolLM2 suite, measured against this cell's target (0.7 × its H₀ = 0.7).
    base = rows[("grpo_ds", 2)]
    assert base.reused and base.target == pytest.approx(0.7) and base.final_avg == GRPO_FINAL[2]
    # Below 0.25 × H₀ from step 5 (0.2) on: collapsed at step 5.
    assert base.collapse == 5 and not base.held()
    # Where entropy ended: the last 10 steps' mean H̄ over the target (0.72/0.68 alternating; 0.1 flat).
    assert held.end_ratio == pytest.approx(1.0) and base.end_ratio == pytest.approx(0.1 / 0.7)
    running = rows[("stare_pi_c2", 0)]
    assert not running.finished and running.steps == STEPS


def test_accuracy_cost_is_paired_by_seed_with_a_t_interval(roots: tuple[Path, Path]) -> None:
    costs = cp.accuracy_cost(cp.rows_of(_entry(roots[0])))
    diffs = [d - g for d, g in zip(DEFAULT_FINAL, GRPO_FINAL)]
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    half = 4.303 * sd / math.sqrt(3)  # t(0.975, 2) = 4.3027
    d = costs["default"]
    assert d.n == 3 and d.mean == pytest.approx(mean)
    assert (d.low, d.high) == (pytest.approx(mean - half, abs=1e-5), pytest.approx(mean + half, abs=1e-5))
    assert not d.significant
    s = costs["stare_pi"]
    assert s.n == 3 and s.mean == pytest.approx(statistics.fmean([-0.20, -0.19, -0.19])) and s.significant
    assert costs["stare_pi_c2"].n == 0  # a run that has not finished is never paired


def test_verdict_per_arm(roots: tuple[Path, Path]) -> None:
    md = suite_markdown(_entry(roots[0]))
    verdict = {r[0]: r[1:] for r in _table_rows(md, "arm | verdict")}
    assert verdict["default"][0] == "held"
    assert verdict["default"][2].endswith("n = 3: not significantly different")
    # Entropy held, accuracy significantly below grpo_ds: does not count.
    assert "does not count as held" in verdict["stare_pi"][0]
    assert "significantly lower" in verdict["stare_pi"][2]
    # Why, measured: where its entropy ended against grpo_ds's (the last 10 steps' mean over the target:
    # held_profile's ±0.02 around 0.7, grpo_ds's floor of 0.1).
    assert verdict["stare_pi"][1] == (
        "entropy at the end (mean H̄ of the last 10 steps over the target): stare_pi 1.00–1.00 ×, "
        f"grpo_ds {0.1 / 0.7:.2f}–{0.1 / 0.7:.2f} × (3 of 3 seeds collapsed)"
    )
    # By how much it missed, and why (measured): the deviation bound, the saturated actuator.
    missed, why, _ = verdict["clip_pi"]
    assert missed.startswith("missed: ") and f"mean deviation {25 * 0.3 / 26:.3f}" in missed
    assert f"{25 * 0.3 / 26 - 0.12:.3f} over 0.12" in missed
    assert "actuator saturated (≥ 20 steps at its clip) on seed 1 (23 steps)" in why
    # Its step noise (0.42 / √2 steps, relative) puts 0.12 out of reach for any law, on every seed.
    noise = math.sqrt((0.21**2 + 24 * 0.42**2) / 25 / 2) / TARGET
    assert f"step noise in the run {noise:.3f} of the target" in why
    assert (
        f"would still deviate by about {0.8 * noise:.3f}: the 0.12 bound is within the run's own noise on seed 0, 1, 2"
        in why
    )
    assert f"noise floor {cp.SMOLLM2_AB_FLOOR[0]:.3f}" in why
    assert verdict["stare_pi_c2"][0] == "not yet known (0 of 3 seeds finished)"
    assert verdict["grpo_ds (reused)"][0].startswith("missed: collapsed on 3/3 seeds")
    assert verdict["grpo_ds (reused)"][2] == "(the comparison)"
    # The per-seed table lists every run, the unfinished one marked.
    per_seed = _table_rows(md, "arm | seed")
    assert ["stare_pi_c2", "0", f"running (step {STEPS})"] == per_seed[
        [r[0] for r in per_seed].index("stare_pi_c2")
    ][:3]
    assert f"**Noise floor**: relative sd of H̄ {cp.SMOLLM2_AB_FLOOR[0]:.3f}" in md
    assert "grpo_ds seeds found: 0, 1, 2" in md


def test_a_miss_on_the_moving_average_says_by_how_many_points(tmp_path: Path) -> None:
    control = tmp_path / "control"
    for seed in SEEDS:
        profile = held_profile if seed != 2 else (lambda s: held_profile(s) if s < 20 else 0.3)
        _write(control / "runs" / "control-tune" / "default" / f"seed{seed}", _events(profile, 0.7))
    md = suite_markdown(_entry(control))
    verdict = {r[0]: r[1:] for r in _table_rows(md, "arm | verdict")}["default"][0]
    row = next(r for r in cp.rows_of(_entry(control)) if r.seed == 2)
    assert row.ma_share is not None and row.ma_share < 0.9
    assert (
        f"MA share {100 * row.ma_share:.0f} % on seed 2, {100 * (0.9 - row.ma_share):.0f} points short"
        in verdict
    )
    assert "no paired seed yet" in md  # no grpo_ds folder: nothing to pair with


def test_a_miss_above_the_band_names_the_side_and_the_lowering_clip(tmp_path: Path) -> None:
    """Seed 2 rises to 1.2 (above 1.25 × 0.7) at step 20 with the law at its lowering clip (output −0.1)
    from there: the moving average (of steps t−4..t) is above the band from step 21, 10 of the 26
    post-settling steps, never below; the output sits at its lowering clip on steps 20..30, 11 of 26."""
    control = tmp_path / "control"
    for seed in SEEDS:
        rise = seed == 2
        profile = (lambda s: held_profile(s) if s < 20 else 1.2) if rise else held_profile
        events = _events(profile, 0.7, clip_from=20 if rise else None, clip_output=-0.1)
        _write(control / "runs" / "control-tune" / "default" / f"seed{seed}", events)
    entry = _entry(control)
    row = next(r for r in cp.rows_of(entry) if r.seed == 2)
    assert row.ma_share == pytest.approx(16 / 26)
    assert (row.ma_above, row.ma_below) == (pytest.approx(10 / 26), 0.0)
    assert row.clip_share == pytest.approx(11 / 26) and row.lower_clip_share == pytest.approx(11 / 26)
    why = {r[0]: r[1:] for r in _table_rows(suite_markdown(entry), "arm | verdict")}["default"][1]
    assert (
        "where the MA share fell short (seed 2) the moving average was above the band on 38 % of the steps "
        "and below it on 0 %, with the output at its lowering clip on 42 %"
    ) in why
    per_seed = _table_rows(suite_markdown(entry), "arm | seed")
    assert per_seed[2][9:12] == [
        "38 % / 0 %",
        f"{row.run_noise:.3f}",
        "42 % (lowering side 42 %; longest 11)",
    ]


def test_a_clip_pi_run_whose_clip_bound_nothing_is_called_inert(tmp_path: Path) -> None:
    """clip_pi's actuator is the ratio clip: seeds 0 and 1 log clip/fraction 0 on every step (one update
    per batch), seed 2 binds it on one step. The why names seeds 0 and 1 only; another law's run, with the
    same zeros, is not judged by its clip."""
    control = tmp_path / "control"
    for seed in SEEDS:
        events = _events(collapsing_profile, 0.7)
        events[0]["spec"]["algorithm"]["name"] = "clip_pi"
        for e in events:
            if e["type"] == "step":
                e["metrics"]["clip/fraction"] = 0.02 if seed == 2 and e["step"] == 3 else 0.0
        _write(control / "runs" / "control-tune" / "clip_pi" / f"seed{seed}", events)
        other = _events(collapsing_profile, 0.7)
        for e in other:
            if e["type"] == "step":
                e["metrics"]["clip/fraction"] = 0.0
        _write(control / "runs" / "control-tune" / "default" / f"seed{seed}", other)
    entry = _entry(control)
    rows = {(r.arm, r.seed): r for r in cp.rows_of(entry)}
    assert [rows[("clip_pi", s)].ratio_clip_share for s in SEEDS] == [0.0, 0.0, pytest.approx(1 / STEPS)]
    assert all(rows[("default", s)].ratio_clip_share is None for s in SEEDS)
    why = {r[0]: r[2] for r in _table_rows(suite_markdown(entry), "arm | verdict")}
    assert why["clip_pi"].startswith(
        "the ratio clip bound no token on any step (clip/fraction 0) on seed 0, 1: with one update per batch"
    )
    assert "ratio clip" not in why["default"]


def test_baseline_target_follows_the_cell_and_the_noise_floor_file_wins(roots: tuple[Path, Path]) -> None:
    control, _ = roots
    cell = control / "runs" / "control-t0.5"
    _write(cell / "default" / "seed0", _events(held_profile, 0.7))
    entry = _entry(control, "control-t0.5")
    base = next(r for r in cp.rows_of(entry) if r.arm == "grpo_ds" and r.seed == 0)
    assert base.target == pytest.approx(0.5 * H0)
    assert {r.arm for r in cp.rows_of(entry) if r.reused} == {"grpo_ds"}  # stare_o1's target was 0.7 × H₀
    (cell / cp.NOISE_FILE).write_text(json.dumps({"relative_sd": 0.31, "samples": 16}))
    md = suite_markdown(_entry(control, "control-t0.5"))
    assert "relative sd of H̄ 0.310 (noise_floor.json: 16 re-samples)" in md
    gym = control / "runs" / "control-gym" / "default" / "seed0"
    _write(gym, _events(held_profile, 0.7))
    assert "**Noise floor**: not measured for this cell." in suite_markdown(_entry(control, "control-gym"))


def test_the_page_command_builds_the_control_page(roots: tuple[Path, Path], tmp_path: Path) -> None:
    control, smollm2 = roots
    md, page = tmp_path / "RESULTS-control.md", tmp_path / "build" / "results-control.html"
    code = cli.main(
        [
            "page",
            "--suite",
            "control-tune",
            "--root",
            str(control),
            "--baseline-root",
            str(smollm2),
            "--header",
            str(cli.REPO / "experiments" / "RESULTS_CONTROL_HEADER.md"),
            "--footer",
            str(cli.REPO / "experiments" / "RESULTS_CONTROL_FOOTER.md"),
            "--md",
            str(md),
            "--html",
            str(page),
        ]
    )
    assert code == 0
    text = md.read_text()
    assert text.startswith("# Entropy held at its target")
    assert "**Verdict per arm**" in text and "| default | held |" in text
    html = page.read_text()
    assert "Verdict per arm" in html and "<svg" in html


def test_a_partial_page_says_the_running_runs_are_listed_but_not_judged(roots: tuple[Path, Path]) -> None:
    md = suite_markdown(_entry(roots[0]))
    assert "**Progress**: 9 of 12 runs finished" in md and "; 1 started, not finished; 2 not started." in md
    assert "a run that has not finished is listed per seed, marked; the verdicts and the paired" in md
