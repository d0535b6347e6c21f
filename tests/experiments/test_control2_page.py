"""The second-generation law's page (experiments/control2_page.py): the 4 × samples section sets the cell's
`hold` beside the cell it repeats, per seed, with the batch entropy's step noise computed from the events."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from experiments import control2_page as page

TARGET = 1.0
STEPS = 40


def _events(
    amplitude: float, final: float = 0.5, steps: int = STEPS, jump: float = 0.0
) -> list[dict[str, Any]]:
    """A held run whose batch entropy alternates target ± amplitude: step-to-step change 2a, so its step noise
    is √((2a)² / 2) / H* = a·√2."""
    spec = {"algorithm": {"name": "entropy_split", "control": {"target_entropy": {"relative": 0.7}}}}
    events: list[dict[str, Any]] = [{"type": "started", "spec": spec}]
    for step in range(1, steps + 1):
        h = TARGET + (amplitude if step % 2 else -amplitude) + (jump if step > 35 else 0.0)
        metrics = {"entropy/mean": h, "entropy/target": TARGET, "control/output": 0.1}
        events.append({"type": "step", "step": step, "metrics": metrics})
    events.append({"type": "eval", "step": STEPS, "metrics": {"eval/avg@k": final, "eval/k": 2.0}})
    return events


def _write(folder: Path, events: list[dict[str, Any]], cpu: dict[str, Any]) -> None:
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / "result.json").write_text(json.dumps({"exit_code": 0, "cpu": cpu}))


XEON = {"model": "Xeon", "vector_extensions": ["avx2", "avx512f"]}
EPYC = {"model": "EPYC", "vector_extensions": ["avx2"]}


@pytest.fixture
def rows(tmp_path: Path) -> list[page.Row]:
    for seed, (one, four) in enumerate([(0.2, 0.1), (0.1, 0.05)]):
        _write(tmp_path / "ctl2-t1.0" / "hold" / f"seed{seed}", _events(one), XEON)
        _write(tmp_path / "ctl2-x4" / "hold" / f"seed{seed}", _events(four), EPYC)
    _write(tmp_path / "ctl2-t1.0" / "hold" / "seed2", _events(0.2), XEON)  # no 4 × run for seed 2
    return page.collect(tmp_path, {"ctl2-t1.0": STEPS, "ctl2-x4": STEPS})


def test_step_noise_per_run_from_the_events(rows: list[page.Row]) -> None:
    noise = {(r.suite, r.seed): r.noise for r in rows}
    assert noise[("ctl2-t1.0", 0)] == pytest.approx(0.2 * math.sqrt(2))
    assert noise[("ctl2-x4", 1)] == pytest.approx(0.05 * math.sqrt(2))
    assert {r.cpu for r in rows} == {"Xeon (AVX-512)", "EPYC (AVX2)"}


def test_the_four_times_section_pairs_seeds_and_states_the_ratio(rows: list[page.Row]) -> None:
    md = page.samples_markdown(rows)
    table = [line for line in md.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [line.split("|")[1].strip() for line in table] == ["0", "1"]  # seed 2 has no 4 × run
    assert table[0].split("|")[2].strip() == f"1–{STEPS}"
    assert table[0].split("|")[3].strip() == f"{0.2 * math.sqrt(2):.3f} → {0.1 * math.sqrt(2):.3f}"
    # mean noise 0.212 → 0.106 and the same deviation halving: both ratios 0.50
    assert md.count("(ratio 0.50;") == 2
    assert "EPYC (AVX2); Xeon (AVX-512)" in md
    assert "4 × the samples" in page.page(rows)


def test_no_section_without_a_finished_pair(rows: list[page.Row]) -> None:
    assert page.samples_markdown([r for r in rows if r.suite != "ctl2-x4"]) == ""


def test_noise_floor_of_holding_by_hand() -> None:
    deviation, share = page.noise_floor_of_holding(0.2)
    sd = 0.2 / math.sqrt(5)  # M averages 5 steps of white noise
    assert deviation == pytest.approx(sd * math.sqrt(2 / math.pi))
    assert share == pytest.approx(math.erf(0.25 / sd / math.sqrt(2)))
    assert 0.994 < share < 0.996  # at σ 0.2 a perfect law still leaves M in ±25 % on 99.5 % of steps
    assert page.noise_floor_of_holding(0.0) == (0.0, 1.0)


def test_each_hold_seed_is_set_against_its_noise_floor(rows: list[page.Row]) -> None:
    md = page.cell_markdown("ctl2-t1.0", [r for r in rows if r.suite == "ctl2-t1.0"])
    floor = next(line for line in md.splitlines() if "noise floor" in line)
    sigma = 0.2 * math.sqrt(2)
    deviation, _ = page.noise_floor_of_holding(sigma)
    assert f"seed 0: σ {sigma:.3f}, MA deviation ≥ {deviation:.3f} (measured 0.040)" in floor
    assert floor.count("seed ") == 3


def test_a_second_round_cell_is_set_against_its_first_rounds_grpo_ds(tmp_path: Path) -> None:
    for seed, (base, hold) in enumerate([(0.60, 0.50), (0.70, 0.62)]):
        _write(tmp_path / "ctl2-g4" / "grpo_ds" / f"seed{seed}", _events(0.1, base), XEON)
        _write(tmp_path / "ctl2-r2-g4" / "hold" / f"seed{seed}", _events(0.1, hold), EPYC)
    _write(tmp_path / "ctl2-r2-g4" / "grpo_ds" / "seed9", _events(0.1, 0.0), EPYC)  # not the baseline's
    text = page.page(page.collect(tmp_path, {"ctl2-g4": STEPS, "ctl2-r2-g4": STEPS}))
    second = text[text.index("### ctl2-r2-g4") :]
    assert "avg@k against grpo_ds -0.090 [" in second  # (−0.10 − 0.08) / 2, paired by seed
    assert "grpo_ds (ctl2-g4's runs): 0 of 2 collapsed" in second
    assert "kp 2, ki 0.05, filter 0.1, rate 0.7" in text and "kp 1, ki 0.1, filter 0.3, rate 0.35" in text


def test_a_running_four_times_run_is_compared_over_the_steps_it_has(tmp_path: Path) -> None:
    # Both runs jump 50 % above the target after step 35; the 4 × run has 33 steps so far (no result.json):
    # over steps 1-33 neither has the jump, so both sit in the band and the excursion is the noise alone.
    _write(tmp_path / "ctl2-r2-t1.0" / "hold" / "seed0", _events(0.2, jump=0.5), XEON)
    folder = tmp_path / "ctl2-r2-x4" / "hold" / "seed0"
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in _events(0.1, steps=33, jump=0.5)[:-1])
    )
    rows = page.collect(tmp_path, {"ctl2-r2-t1.0": STEPS, "ctl2-r2-x4": STEPS})
    md = page.samples_markdown(rows, ("ctl2-r2-t1.0", "ctl2-r2-x4"))
    row = next(line for line in md.splitlines() if line.startswith("| 0 "))
    cells = [c.strip() for c in row.split("|")]
    assert cells[2] == "1–33 (4 × still running)"
    assert cells[5] == "100% → 100%"  # the whole 40-step 1 × run would leave the band after step 35
    assert page.samples_markdown([r for r in rows if r.suite != "ctl2-r2-x4" or r.steps >= 40]) == ""


def _descending(steps: int, law: bool) -> list[dict[str, Any]]:
    """Entropy falling linearly from 2 × the target to it over 40 steps, then flat at it."""
    spec = {"algorithm": {"name": "entropy_split" if law else "grpo_ds"}}
    events: list[dict[str, Any]] = [{"type": "started", "spec": spec}]
    for step in range(1, steps + 1):
        metrics = {"entropy/mean": TARGET * max(1.0, 2.0 - (step - 1) / 39)}
        if law:
            metrics["entropy/target"] = TARGET
        events.append({"type": "step", "step": step, "metrics": metrics})
    return events


def test_a_late_settling_is_set_beside_grpo_dss_own_descent(tmp_path: Path) -> None:
    _write(tmp_path / "ctl2-tiny05" / "grpo_ds" / "seed0", _descending(60, law=False), EPYC)
    _write(tmp_path / "ctl2-tiny05" / "hold" / "seed0", _descending(60, law=True), EPYC)
    rows = page.collect(tmp_path, {"ctl2-tiny05": 60})
    hold = next(r for r in rows if r.arm == "hold")
    # the 5-step mean of the linear fall first reaches 1.25 × the target at step 33; within ±25 % from there
    assert hold.settling == 33 and page.descent_step(hold.series, TARGET) == 33
    md = page.cell_markdown("ctl2-tiny05", rows)
    assert (
        "settled late: grpo_ds's own moving average first came within +25 % of the target at step 33 " in md
    )
    assert "(seed 0, `hold` settled at 33)" in md
