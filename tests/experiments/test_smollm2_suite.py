"""The SmolLM2 suite reduced to one seed, 10 steps, grpo_ds at the headline lr: real trainer runs through
the experiment runner, asserting only robust facts: the task's start accuracy is inside the range the
suite states, entropy falls under grpo_ds, and the stability metrics the engine logged, the page's numbers
and contract/stability.py over the events all agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract import stability
from experiments import analysis as an
from experiments.page import collect, write_page
from experiments.plan import OPTIONAL_SUITES
from experiments.runner import Runner, events_of, run_dir
from experiments.smollm2 import HEADLINE_LR, METHODS, START_ACCURACY_RANGE, smollm2_suites

STEPS = 10


def test_the_full_suite_has_every_method_two_rates_three_seeds_headline_first() -> None:
    suites = smollm2_suites()
    assert [s.name for s in suites] == list(n for n in OPTIONAL_SUITES if n.startswith("smollm2-add"))
    lrs = {s.runs[0].spec["optim"]["lr"] for s in suites}
    assert len(lrs) == 2 and suites[0].runs[0].spec["optim"]["lr"] == HEADLINE_LR
    for suite in suites:
        assert set(METHODS) <= set(suite.arms)
        for arm in suite.arms:
            assert sorted(r.seed for r in suite.runs if r.arm == arm) == [0, 1, 2]
        # The headline pair over every seed starts first; every run is one thread, checkpoints pruned.
        assert {r.arm for r in suite.runs[:6]} == {"grpo_ds", "stare_o1"}
        # Then STARE at the drift analysis's recommended settings, over every seed.
        assert {r.arm for r in suite.runs[6:12]} == {"stare_w4", "stare_adaptive_fast"}
        assert all(r.threads == 1 and not r.keep_checkpoints for r in suite.runs)
        specs = [r.spec for r in suite.runs]
        # The arms differ in their algorithm section alone.
        assert (
            len({str({k: v for k, v in s.items() if k not in ("algorithm", "name", "seed")}) for s in specs})
            == 1
        )


@pytest.fixture(scope="module")
def reduced_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    (suite,) = smollm2_suites(lrs=(HEADLINE_LR,), seeds=1, steps=STEPS, methods=("grpo_ds",))
    root = tmp_path_factory.mktemp("smollm2")
    # The suite's one thread: under `make test`'s two xdist workers the run shares the machine with the
    # other worker's tests, which two threads would make spin (docs/TESTING.md, "Two workers").
    counts = Runner(root, suite.runs, jobs=2, log=lambda _m: None).run()
    assert counts["done"] == 1, counts
    return root


@pytest.mark.slow
def test_start_accuracy_is_in_the_stated_range(reduced_root: Path) -> None:
    (suite,) = smollm2_suites(lrs=(HEADLINE_LR,), seeds=1, steps=STEPS, methods=("grpo_ds",))
    events = events_of(run_dir(reduced_root, suite.runs[0]))
    start = next(e["metrics"]["eval/avg@k"] for e in events if e["type"] == "eval" and e["step"] == 0)
    low, high = START_ACCURACY_RANGE
    assert low <= start <= high


@pytest.mark.slow
def test_entropy_falls_under_grpo_ds_and_the_stability_metrics_equal_the_events(
    reduced_root: Path, tmp_path: Path
) -> None:
    (suite,) = smollm2_suites(lrs=(HEADLINE_LR,), seeds=1, steps=STEPS, methods=("grpo_ds",))
    path = run_dir(reduced_root, suite.runs[0])
    events = events_of(path)
    steps = [(e["step"], e["metrics"]) for e in events if e["type"] == "step"]
    assert len(steps) == STEPS
    entropy = [(s, m["entropy/mean"]) for s, m in steps]
    first, last = sum(h for _, h in entropy[:3]) / 3, sum(h for _, h in entropy[-3:]) / 3
    assert last < 0.8 * first, entropy
    # grpo_ds has no controller: no target logged, so no holding metric; collapse is logged every step and
    # equals the definition over the entropy series so far.
    for i, (_s, m) in enumerate(steps):
        assert m[stability.COLLAPSE_STEP] == float(stability.collapse_step(entropy[: i + 1]) or 0)
        assert stability.HOLD_FRACTION not in m
    # The page's summary: the same definitions over the same events, with the suite's shared target.
    data = collect(reduced_root, [suite])
    summary = data["suites"][0]["runs"][0]["summary"]
    assert summary.collapse_time == stability.collapse_step(entropy)
    target = suite.runs[0].spec["algorithm"]["gate"]["target_entropy"]["relative"] * entropy[0][1]
    assert (summary.hold_fraction, summary.post_gate_steps) == stability.hold_fraction(entropy, target)
    assert summary == an.summarize_run(summary.run, events, arm="grpo_ds", warmup_steps=0, collapse_streak=5,
                                       wall_seconds=summary.wall_seconds, plan_spec=suite.runs[0].spec)  # fmt: skip
    md = tmp_path / "R.md"
    write_page(reduced_root, [suite], md, tmp_path / "r.html", header="# h", footer="")
    text = md.read_text()
    assert "1 of 1 runs finished" in text and "Partial" not in text
    shown = "never" if summary.collapse_time is None else str(summary.collapse_time)
    assert "| grpo_ds | 1 |" in text and f"{shown} (" in text
