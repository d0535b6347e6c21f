"""The experiment runner on a reduced comparison: one seed, the tiny model, a few steps, real trainer runs.

Only robust facts are asserted: under grpo_ds the gate never acts; under stare with entropy below the
target the gate is on, and the reweight ratio and mean_weight are what STARE specifies; the runner's
table equals what the events say; finished runs are skipped and interrupted ones resumed.
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments import analysis as an
from experiments.page import arm_rows, collect, paired, write_page
from experiments.plan import SFT_REF, Run, Suite, comparison_suite
from experiments.runner import Runner, events_of, is_finished, run_dir
from trainer.report import CSS_FILE

REPO = Path(__file__).resolve().parents[2]

BASE = {
    "seed": 0,
    "model": {"name": "tiny-arith"},
    "task": {"source": "arithmetic", "train_size": 64, "eval_size": 8},
    # A loose numeric verifier gives the untrained model mixed rewards, so every step updates.
    "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
    # The random model's entropy (~3 nats) is below 5: STARE's gate is on at every step.
    "algorithm": {"gate": {"target_entropy": 5.0}},
    "sampling": {"group_size": 4, "max_new_tokens": 5},
    "optim": {"lr": 1e-3, "steps": 6, "prompts_per_step": 4, "micro_batch_size": 16},
    "sft": {"steps": 5, "batch_size": 16},
    "entropy_band": {"low": 0.1, "high": 4.0},
    "checkpoint": {"interval": 2, "keep_last": 2},
    "evaluation": {"interval": 3},
}


def reduced_suite() -> Suite:
    return comparison_suite(
        "reduced",
        "reduced",
        "one seed, tiny model",
        BASE,
        arms=("grpo_ds", "stare_o1"),
        seeds=1,
        headline_seeds=1,
    )


@pytest.fixture(scope="module")
def finished_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("experiments")
    suite = reduced_suite()
    counts = Runner(root, suite.runs, jobs=2, log=lambda _m: None).run()
    assert counts == {"done": 3, "skipped": 0, "failed": 0, "stopped": 0, "blocked": 0}
    return root


def test_the_plan_shares_one_sft_per_seed_and_names_it_in_the_specs() -> None:
    suite = reduced_suite()
    ids = [r.id for r in suite.runs]
    assert ids == ["reduced/sft/seed0", "reduced/grpo_ds/seed0", "reduced/stare_o1/seed0"]
    sft, grpo, stare = suite.runs
    assert sft.spec["sft"] == BASE["sft"] and sft.spec["optim"]["steps"] == 1
    for arm in (grpo, stare):
        assert "sft" not in arm.spec
        assert arm.needs == ("reduced/sft/seed0",)
        assert arm.spec["model"]["name"] == f"{SFT_REF}reduced/sft/seed0"
        resolved = arm.resolve_spec(lambda rid: Path("/r") / rid)
        assert resolved["model"]["name"] == "/r/reduced/sft/seed0/checkpoints/step-000000/model"
        # Same budget and shared gate for every arm; only the loss differs.
        assert arm.spec["optim"] == BASE["optim"]
        assert arm.spec["algorithm"]["gate"] == BASE["algorithm"]["gate"]
    assert grpo.spec["algorithm"]["name"] == "grpo_ds"
    assert stare.spec["algorithm"]["name"] == "stare" and stare.spec["algorithm"]["params"]["variant"] == "O1"


def test_headline_arms_get_more_seeds() -> None:
    suite = comparison_suite(
        "s", "s", "d", BASE, arms=("grpo_ds", "stare_o1", "rsi_s"), seeds=3, headline_seeds=5
    )
    per_arm = {a: sum(r.arm == a for r in suite.runs) for a in ("grpo_ds", "stare_o1", "rsi_s")}
    assert per_arm == {"grpo_ds": 5, "stare_o1": 5, "rsi_s": 3}
    assert sum(r.name.startswith("sft/") for r in suite.runs) == 5


def test_under_grpo_ds_the_gate_never_acts(finished_root: Path) -> None:
    steps = [
        e["metrics"] for e in events_of(finished_root / "runs/reduced/grpo_ds/seed0") if e["type"] == "step"
    ]
    assert len(steps) == BASE["optim"]["steps"]
    assert all("stare/gate_on" not in m for m in steps)
    assert all(m.get("stare/mean_weight", 1.0) == 1.0 for m in steps)


def test_under_stare_below_target_the_gate_is_on_and_weights_are_as_specified(finished_root: Path) -> None:
    steps = [
        e["metrics"] for e in events_of(finished_root / "runs/reduced/stare_o1/seed0") if e["type"] == "step"
    ]
    assert len(steps) == BASE["optim"]["steps"]
    for m in steps:
        assert m["entropy/mean"] < 5.0
        assert m["stare/gate_on"] == 1.0
        # O1: |L⁺| = max(1, ⌈P·|T⁺|⌉) of the positive tokens get W, nothing else is reweighted, so
        # mean_weight = 1 + (W − 1)·|L⁺|/N (the engine reports the ratios over the step's active tokens).
        assert m["stare/negative_reweight_ratio"] == 0.0
        assert m["stare/positive_reweight_ratio"] <= m["stare/positive_candidate_ratio"]
        if m["stare/positive_candidate_ratio"] > 0:
            assert m["stare/positive_reweight_ratio"] > 0
        assert m["stare/mean_weight"] == pytest.approx(1 + 0.1 * m["stare/positive_reweight_ratio"], abs=1e-6)
        # One micro-batch per step (16 responses, micro_batch_size 16): the scope is the step's N active
        # tokens, |T⁺| = candidate ratio·N and |L⁺| = max(1, ⌈0.1·|T⁺|⌉) (the official int(n·P + 0.999999)).
        n = round(m["response/length_mean"] * m["data/responses"])
        candidates = round(m["stare/positive_candidate_ratio"] * n)
        if candidates:
            selected = min(candidates, max(1, int(candidates * 0.1 + 0.999999)))
            assert m["stare/positive_reweight_ratio"] == pytest.approx(selected / n, abs=1e-6)


def test_both_arms_start_from_the_same_sft_weights(finished_root: Path) -> None:
    evals = {
        arm: next(e for e in events_of(finished_root / f"runs/reduced/{arm}/seed0") if e["type"] == "eval")
        for arm in ("grpo_ds", "stare_o1")
    }
    assert evals["grpo_ds"]["step"] == evals["stare_o1"]["step"] == 0
    assert evals["grpo_ds"]["metrics"] == evals["stare_o1"]["metrics"]


def test_the_table_equals_what_the_events_say(finished_root: Path, tmp_path: Path) -> None:
    suite = reduced_suite()
    data = collect(finished_root, [suite])
    rows = {r["arm"]: r for r in arm_rows(suite, data["suites"][0]["runs"])}
    for arm in ("grpo_ds", "stare_o1"):
        events = events_of(finished_root / f"runs/reduced/{arm}/seed0")
        evals = [e for e in events if e["type"] == "eval"]
        steps = [e["metrics"] for e in events if e["type"] == "step"]
        entropies = [m["entropy/mean"] for m in steps]
        row = rows[arm]
        assert row["n"] == 1
        assert row["sft_avg"].mean == evals[0]["metrics"]["eval/avg@k"]
        assert row["final_avg"].mean == evals[-1]["metrics"]["eval/avg@k"]
        assert row["final_pass"].mean == evals[-1]["metrics"]["eval/pass@k"]
        assert row["entropy_min"].mean == min(entropies)
        assert row["entropy_last"].mean == entropies[-1]
        low, high = BASE["entropy_band"]["low"], BASE["entropy_band"]["high"]
        in_band = [low <= h <= high for i, h in enumerate(entropies, 1) if i > suite.warmup_steps]
        expected = sum(in_band) / len(in_band) if in_band else None
        assert row["in_band"].mean == expected
        gate = [m.get("stare/gate_on") for m in steps if "stare/gate_on" in m]
        assert row["gate_on"].mean == (sum(gate) / len(gate) if gate else None)
    diffs = {d.metric: d for d in paired(data["suites"][0]["runs"])}
    assert diffs["final_avg"].n == 1
    assert diffs["final_avg"].mean == pytest.approx(
        rows["stare_o1"]["final_avg"].mean - rows["grpo_ds"]["final_avg"].mean
    )
    md, page = tmp_path / "R.md", tmp_path / "r.html"
    summary = write_page(finished_root, [suite], md, page, header="# H", footer="F")
    text = md.read_text()
    assert "| grpo_ds | 1 |" in text and "| stare_o1 | 1 |" in text
    on = [
        e["metrics"]["stare/mean_weight"]
        for e in events_of(finished_root / "runs/reduced/stare_o1/seed0")
        if e["type"] == "step" and e["metrics"]["stare/gate_on"] > 0
    ]
    assert f"mean_weight {sum(on) / len(on):.4f} (seeds: 1)" in text
    assert page.read_text().count("<svg") >= 5
    # the page links the report's stylesheet (one copy in the repository) by a path that resolves from it
    (href,) = re.findall(r'<link rel="stylesheet" href="([^"]+)">', page.read_text())
    assert (page.parent / href).resolve() == CSS_FILE.resolve()
    assert {r["arm"] for r in summary["reduced"]} == {None, "grpo_ds", "stare_o1"}


def test_finished_runs_are_compacted_and_skipped(finished_root: Path) -> None:
    suite = reduced_suite()
    # The writer side of results/ (experiments/rundata.py): a finished run keeps its events compressed and
    # its summary; the checkpoints go unless another run needs them (the shared SFT).
    for run in suite.runs:
        folder = run_dir(finished_root, run)
        assert (folder / "events.jsonl.gz").is_file() and not (folder / "events.jsonl").exists(), run.id
        assert (folder / "result.json").is_file()
        assert (folder / "checkpoints").is_dir() == run.keep_checkpoints, run.id
    before = {r.id: (run_dir(finished_root, r) / "events.jsonl.gz").stat().st_mtime_ns for r in suite.runs}
    counts = Runner(finished_root, suite.runs, jobs=2, log=lambda _m: None).run()
    assert counts["skipped"] == 3 and counts["done"] == 0
    after = {r.id: (run_dir(finished_root, r) / "events.jsonl.gz").stat().st_mtime_ns for r in suite.runs}
    assert before == after


def test_an_interrupted_plan_resumes_where_it_stopped(tmp_path: Path) -> None:
    """SIGINT to `python -m experiments run` stops the runs at a checkpoint (exit 75); the same command
    continues them with --resume, and the resumed run's steps equal an uninterrupted run's."""
    spec = {**BASE, "optim": {**BASE["optim"], "steps": 40}, "checkpoint": {"interval": 5, "keep_last": 2}}
    spec.pop("sft")
    run = Run("resume", "grpo_ds/seed0", {**spec, "algorithm": {"name": "grpo_ds"}}, arm="grpo_ds")
    root = tmp_path / "root"
    script = (
        "import sys; from pathlib import Path; from experiments.runner import Runner; "
        "from experiments.plan import Run; import json; "
        f"r = Run(**json.loads({json.dumps(run.__dict__)!r})); "
        "c = Runner(Path(sys.argv[1]), [r], jobs=1, log=print).run(); print(c); sys.exit(75 if c['stopped'] else 0)"
    )
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "STARE_STEP_DELAY_S": "0.05"}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(root)], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    path = run_dir(root, run)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any((path / "checkpoints").glob("step-000010")):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 75, out
    assert not is_finished(path) and (path / "events.jsonl").is_file()  # unfinished: kept plain
    stopped_at = max(int(p.name.split("-")[1]) for p in (path / "checkpoints").glob("step-*"))
    assert 0 < stopped_at < 40
    again = subprocess.run(
        [sys.executable, "-c", script, str(root)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumed" in again.stdout
    result = json.loads((path / "result.json").read_text())
    assert result["attempts"] == 2 and result["exit_code"] == 0
    resumed = {e["step"]: e["metrics"] for e in events_of(path) if e["type"] == "step"}
    assert sorted(resumed) == list(range(1, 41))
    straight = tmp_path / "straight"
    Runner(straight, [run], jobs=1, log=lambda _m: None).run()
    fresh = {e["step"]: e["metrics"] for e in events_of(run_dir(straight, run)) if e["type"] == "step"}
    strip = lambda m: {k: v for k, v in m.items() if not k.startswith("perf/")}  # noqa: E731
    assert {s: strip(m) for s, m in resumed.items()} == {s: strip(m) for s, m in fresh.items()}


def test_a_failed_dependency_blocks_the_runs_that_need_it(tmp_path: Path) -> None:
    bad = Run("x", "sft/seed0", {**BASE, "optim": {"lr": -1.0}})  # invalid spec: exit 2
    child = Run(
        "x", "grpo_ds/seed0", {**BASE, "model": {"name": f"{SFT_REF}x/sft/seed0"}}, needs=("x/sft/seed0",)
    )
    counts = Runner(tmp_path, [bad, child], jobs=2, log=lambda _m: None).run()
    assert counts["failed"] == 1 and counts["blocked"] == 1
    assert json.loads((run_dir(tmp_path, bad) / "result.json").read_text())["exit_code"] == 2


@pytest.mark.parametrize(
    ("pairs", "significant"),
    [([(1.0, 0.0), (1.1, 0.0), (0.9, 0.0)], True), ([(1.0, 0.0), (-1.0, 0.0), (0.1, 0.0)], False)],
)
def test_paired_difference_uses_a_t_interval(pairs: list[tuple[float, float]], significant: bool) -> None:
    d = an.paired_difference("m", pairs)
    diffs = [t - c for t, c in pairs]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / 2)
    assert d.mean == pytest.approx(mean)
    assert d.high - d.mean == pytest.approx(4.303 * sd / math.sqrt(3))  # t(0.975, df 2)
    assert d.significant is significant


def test_no_spread_or_two_seeds_is_never_significant() -> None:
    assert not an.paired_difference("m", [(0.6, 0.5), (0.7, 0.6), (0.8, 0.7)]).significant
    assert not an.paired_difference("m", [(1.0, 0.0), (1.1, 0.0)]).significant


def test_pearson_and_its_fisher_interval() -> None:
    xs = [float(i) for i in range(10)]
    c = an.pearson(xs, [2 * x + 1 for x in xs])
    assert c.r == pytest.approx(1.0)
    ys = [1.0, 3.0, 2.0, 5.0, 4.0, 6.0, 8.0, 7.0, 10.0, 9.0]
    c = an.pearson(xs, ys)
    assert 0.9 < c.r < 1.0 and c.low < c.r < c.high and c.n == 10
    assert math.tanh(math.atanh(c.r) - 1.96 / math.sqrt(7)) == pytest.approx(c.low)


def test_collapse_is_the_first_step_of_a_long_enough_streak_below_the_band() -> None:
    h = [(1, 0.5), (2, 0.05), (3, 0.05), (4, 0.5), (5, 0.05), (6, 0.04), (7, 0.03)]
    assert an.collapse_step(h, 0.1, 3) == 5
    assert an.collapse_step(h, 0.1, 4) is None


def test_an_unknown_arm_is_refused_listing_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown arm\(s\) \['ppo'\]; valid: grpo_ds, stare_o1"):
        comparison_suite(
            "x", "x", "x", {"model": {"name": "tiny-arith"}}, arms=("ppo",), seeds=1, headline_seeds=1
        )
