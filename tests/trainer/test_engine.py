"""The engine end to end on the tiny model: events and metrics, checkpoints, exact resume, signals, NaN."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from contract.spec import TrainSpec
from trainer.engine import Engine, ExitCode
from trainer.policy.placement import REFERENCE_FILE

ROOT = Path(__file__).resolve().parents[2]

REQUIRED_STEP_METRICS = [
    "entropy/mean",
    "entropy/band_low",
    "entropy/band_high",
    "entropy/band_state",
    "entropy/steps_out_of_band",
    "stare/gate_on",
    "stare/reweight_w",
    "stare/reweight_m",
    "stare/positive_candidate_ratio",
    "stare/negative_candidate_ratio",
    "stare/positive_reweight_ratio",
    "stare/negative_reweight_ratio",
    "stare/mean_weight",
    "quadrant/pos_low_fraction",
    "quadrant/pos_high_fraction",
    "quadrant/neg_low_fraction",
    "quadrant/neg_high_fraction",
    "quadrant/pos_low_drift",
    "quadrant/neg_high_drift",
    "quadrant/predicted_drift",
    "reward/mean",
    "reward/std",
    "reward/accuracy",
    "reward/zero_std_fraction",
    "response/length_mean",
    "response/reflection_rate",
    "clip/low_fraction",
    "clip/high_fraction",
    "clip/dual_fraction",
    "kl/approx_old",
    "loss/policy",
    "perf/step_seconds",
    "perf/tokens_per_second",
]


def small_spec(**overrides) -> dict:
    data = {
        "seed": 3,
        "model": {"name": "tiny-arith"},
        "task": {"source": "arithmetic", "train_size": 64, "eval_size": 8},
        # A loose numeric verifier gives an untrained model mixed rewards, so every step really updates.
        "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
        "algorithm": {"name": "stare", "gate": {"target_entropy": 5.0}},
        "sampling": {"group_size": 4, "max_new_tokens": 5},
        "optim": {"lr": 1e-3, "steps": 4, "prompts_per_step": 3, "micro_batch_size": 5},
        "checkpoint": {"interval": 2, "keep_last": 5},
        "evaluation": {"interval": 0},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return data


def read_events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def step_metrics(events: list[dict]) -> dict[int, dict]:
    return {
        e["step"]: {k: v for k, v in e["metrics"].items() if not k.startswith("perf/")}
        for e in events
        if e["type"] == "step"
    }


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    latest = sorted((out / "checkpoints").glob("step-*"))[-1]
    return load_file(str(latest / "model" / "model.safetensors"))


def test_run_writes_events_checkpoints_and_report(tmp_path):
    out = tmp_path / "run"
    events_seen: list[dict] = []
    # Seed 0: every step's batch holds a group with mixed rewards (zero_std_fraction < 1, asserted below);
    # with seed 3 step 2's groups all have equal rewards (trainer.rollout.sampling draws each prompt's samples).
    spec = TrainSpec.model_validate(small_spec(seed=0))
    code = Engine(spec, out, callbacks=[events_seen.append]).run()
    assert code == ExitCode.OK
    events = read_events(out)
    assert events == events_seen
    kinds = [e["type"] for e in events]
    assert kinds[0] == "started" and kinds[-1] == "finished"
    assert [e["step"] for e in events if e["type"] == "step"] == [1, 2, 3, 4]
    for e in events:
        if e["type"] == "step":
            missing = [m for m in REQUIRED_STEP_METRICS if m not in e["metrics"]]
            assert not missing, missing
            assert e["metrics"]["reward/zero_std_fraction"] < 1.0
            fractions = sum(
                e["metrics"][f"quadrant/{q}_fraction"] for q in ("pos_low", "pos_high", "neg_low", "neg_high")
            )
            assert 0.0 <= fractions <= 1.0 + 1e-6
    evals = [e for e in events if e["type"] == "eval"]
    assert [e["step"] for e in evals] == [0, 4]
    assert {"eval/avg@k", "eval/pass@k"} <= set(evals[0]["metrics"])
    assert [e["step"] for e in events if e["type"] == "checkpoint"] == [0, 2, 4]
    assert (out / "report.json").is_file() and (out / "report.html").is_file()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = out / "checkpoints" / "step-000004" / "model"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert tok.padding_side == "left"
    reloaded = {k: v for k, v in model.state_dict().items()}
    saved = final_weights(out)
    for name, tensor in saved.items():
        assert torch.equal(reloaded[name], tensor), name
    state = json.loads((ckpt.parent / "state.json").read_text())
    assert state["step"] == 4 and state["cursor"] == 4 * 3


def test_keep_last_prunes_old_checkpoints(tmp_path):
    out = tmp_path / "run"
    spec = small_spec(checkpoint={"interval": 1, "keep_last": 2})
    assert Engine(TrainSpec.model_validate(spec), out).run() == ExitCode.OK
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-000003", "step-000004"]
    assert not list((out / "checkpoints").glob(".tmp-*"))


class _StopAfter:
    """A callback that asks the engine to stop after a given step, as SIGTERM would."""

    def __init__(self, step: int, hard: bool) -> None:
        self.step, self.hard, self.engine = step, hard, None

    def __call__(self, event: dict) -> None:
        if event["type"] == "step" and event["step"] == self.step:
            if self.hard:
                raise KeyboardInterrupt  # a crash: no checkpoint of this step
            self.engine.request_stop(signal.SIGTERM)


@pytest.mark.parametrize("hard", [False, True], ids=["graceful", "crash"])
@pytest.mark.parametrize("algorithm", ["stare", "grpo", "adaptive_entropy"])
def test_interrupted_and_resumed_run_matches_uninterrupted(tmp_path, hard, algorithm):
    # adaptive_entropy: a large step and a target above the tiny model's entropy, so the coefficient is
    # non-zero and changing when the run is cut: the resumed run must restore it.
    params = {"coef_step": 0.05, "coef_init": 0.02} if algorithm == "adaptive_entropy" else {}
    spec = TrainSpec.model_validate(
        small_spec(algorithm={"name": algorithm, "params": params, "gate": {"target_entropy": 5.0}})
    )
    full = tmp_path / "full"
    assert Engine(spec, full).run() == ExitCode.OK

    part = tmp_path / "part"
    stopper = _StopAfter(3, hard)
    engine = Engine(spec, part, callbacks=[stopper])
    stopper.engine = engine
    if hard:
        with pytest.raises(KeyboardInterrupt):
            engine.run()
        assert json.loads((part / "checkpoints" / "step-000002" / "state.json").read_text())["step"] == 2
    else:
        assert engine.run() == ExitCode.INTERRUPTED
        assert (part / "checkpoints" / "step-000003").is_dir()
    assert Engine(spec, part, resume=True).run() == ExitCode.OK

    a, b = step_metrics(read_events(full)), step_metrics(read_events(part))
    assert sorted(b) == [1, 2, 3, 4]
    assert a == b
    wa, wb = final_weights(full), final_weights(part)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


def crash_after(spec: TrainSpec, out: Path, step: int) -> None:
    """A run into `out` that crashes (KeyboardInterrupt) after `step`: no checkpoint of that step."""
    stopper = _StopAfter(step, True)
    engine = Engine(spec, out, callbacks=[stopper])
    stopper.engine = engine
    with pytest.raises(KeyboardInterrupt):
        engine.run()


def crash_after_then_resume(spec: TrainSpec, out: Path, step: int) -> None:
    """A run into `out` that crashes (KeyboardInterrupt) after `step`, then resumed to the end."""
    crash_after(spec, out, step)
    assert Engine(spec, out, resume=True).run() == ExitCode.OK


def _write_spec(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _cli(args: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_sigterm_checkpoints_and_exits_75(tmp_path):
    spec = _write_spec(tmp_path, small_spec(optim={"steps": 10_000}, checkpoint={"interval": 1000}))
    out = tmp_path / "run"
    proc = _cli(["run", str(spec), "--out", str(out), "--no-progress"])
    deadline = time.time() + 120
    while time.time() < deadline:
        events = (out / "events.jsonl").read_text().splitlines() if (out / "events.jsonl").exists() else []
        if any(json.loads(line)["type"] == "step" for line in events if line.strip()):
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    events = read_events(out)
    stop = [e for e in events if e["type"] == "interrupted"]
    assert len(stop) == 1
    ckpts = [e["step"] for e in events if e["type"] == "checkpoint"]
    assert ckpts[-1] == stop[0]["step"] >= 1
    assert (out / "checkpoints" / f"step-{stop[0]['step']:06d}" / "model" / "model.safetensors").is_file()


def test_non_finite_loss_stops_with_the_step_named(tmp_path):
    spec = _write_spec(tmp_path, small_spec(checkpoint={"interval": 1}))
    out = tmp_path / "run"
    proc = _cli(["run", str(spec), "--out", str(out), "--no-progress"], env={"STARE_INJECT_NAN_STEP": "3"})
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == ExitCode.NON_FINITE, err
    events = read_events(out)
    error = [e for e in events if e["type"] == "error"]
    assert error and error[0]["step"] == 3 and "step 3" in error[0]["message"]
    assert [e["step"] for e in events if e["type"] == "step"] == [1, 2]
    assert (out / "checkpoints" / "step-000002" / "model" / "model.safetensors").is_file()
    assert not (out / "checkpoints" / "step-000003").exists()


def test_cli_rejects_bad_spec_naming_the_field(tmp_path):
    spec = _write_spec(tmp_path, small_spec(optim={"lr": -1.0}))
    proc = _cli(["run", str(spec), "--out", str(tmp_path / "run")])
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "optim.lr" in err
    assert not (tmp_path / "run").exists()


def test_lora_run_saves_adapter_and_merged_model(tmp_path):
    out = tmp_path / "run"
    spec = small_spec(
        model={"name": "tiny-arith", "lora": {"r": 4, "alpha": 8, "merge_on_save": True}},
        optim={"steps": 2},
    )
    assert Engine(TrainSpec.model_validate(spec), out).run() == ExitCode.OK
    ckpt = out / "checkpoints" / "step-000002"
    assert (ckpt / "adapter" / "adapter_config.json").is_file()
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(ckpt / "model")
    assert not any("lora" in name for name, _ in merged.named_parameters())


def test_pruned_checkpoints_are_announced(tmp_path):
    out = tmp_path / "run"
    spec = small_spec(checkpoint={"interval": 1, "keep_last": 2}, optim={"steps": 3})
    assert Engine(TrainSpec.model_validate(spec), out).run() == ExitCode.OK
    events = read_events(out)
    deleted = [e["step"] for e in events if e["type"] == "checkpoint_deleted"]
    kept = {int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*")}
    assert deleted == [0, 1] and kept == {2, 3}


def _steps(out: Path) -> list[dict]:
    return [e["metrics"] for e in read_events(out) if e["type"] == "step"]


def test_dynamic_sampling_trains_only_on_informative_groups(tmp_path):
    out = tmp_path / "run"
    spec = small_spec(
        algorithm={"name": "grpo_ds"},
        optim={"steps": 3, "dynamic_sampling": {"enabled": True, "max_gen_batches": 4}},
    )
    assert Engine(TrainSpec.model_validate(spec), out).run() == ExitCode.OK
    for m in _steps(out):
        assert m["reward/zero_std_fraction"] == 0.0  # every kept group has varied rewards
        assert m["perf/gen_batches"] in (1.0, 2.0, 3.0, 4.0)  # whole batches, at most max_gen_batches
        assert m["data/responses"] % 4 == 0 and m["data/responses"] <= 3 * 4
        if m["perf/gen_batches"] < 4:  # stopped early only because 3 informative groups were kept
            assert m["data/responses"] == 3 * 4
    state = json.loads((out / "checkpoints" / "step-000003" / "state.json").read_text())
    gen_batches = sum(m["perf/gen_batches"] for m in _steps(out))
    assert state["cursor"] == gen_batches * 3  # each generation batch consumed prompts_per_step prompts


def test_dapo_applies_the_overlong_penalty(tmp_path):
    out = tmp_path / "run"
    # Budget 5 tokens with a 4-token buffer: responses longer than 1 token are penalised, so rewards go below 0.
    spec = small_spec(
        algorithm={"name": "dapo"},
        optim={"steps": 2},
        reward={"style": "binary", "overlong": {"cache_length": 4}},
    )
    assert Engine(TrainSpec.model_validate(spec), out).run() == ExitCode.OK
    means = [(m["reward/mean"], m["reward/accuracy"]) for m in _steps(out)]
    assert all(mean < accuracy for mean, accuracy in means)


def test_jsonl_task_with_sft_and_sampled_evaluation(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
            for a in range(8)
            for b in range(8)
        )
    )
    out = tmp_path / "run"
    spec = small_spec(
        task={"source": "jsonl", "path": str(data), "train_size": 0, "eval_size": 8},
        sft={"steps": 20, "lr": 3e-3, "batch_size": 32},
        evaluation={"interval": 0, "greedy": False, "k": 3},
        optim={"steps": 2},
    )
    assert Engine(TrainSpec.model_validate(spec), out).run() == ExitCode.OK
    events = read_events(out)
    assert [e["step"] for e in events if e["type"] == "sft"] == [20]
    evals = [e["metrics"] for e in events if e["type"] == "eval"]
    assert all(m["eval/k"] == 3.0 and m["eval/num_prompts"] == 8.0 for m in evals)
    assert all(m["eval/pass@k"] >= m["eval/avg@k"] for m in evals)


def test_reasoning_gym_task_runs(tmp_path):
    out = tmp_path / "run"
    spec = small_spec(
        task={"source": "reasoning_gym", "name": "chain_sum", "train_size": 16, "eval_size": 4},
        verifier={"name": "reasoning_gym", "params": {}},
        optim={"steps": 1},
        sampling={"max_new_tokens": 4},
    )
    assert Engine(TrainSpec.model_validate(spec), out).run() == ExitCode.OK
    assert len(_steps(out)) == 1


def run_counting_forwards(monkeypatch, data: dict, out: Path, *, sample_stats: bool = True):
    """Runs the spec; returns (step metrics, final weights, [(rows, grad enabled)] per scoring forward).
    sample_stats=False: rollouts never record sampling statistics, so the update cannot read them."""
    import trainer.data as data_module
    import trainer.policy.scoring as scoring_module

    calls: list[tuple[int, bool]] = []
    real, real_rollout = scoring_module.response_logits, data_module.rollout

    def spy(model, input_ids, *args, **kwargs):
        calls.append((input_ids.shape[0], torch.is_grad_enabled()))
        return real(model, input_ids, *args, **kwargs)

    def rollout(*args, **kwargs):
        return real_rollout(*args, **{**kwargs, "sample_stats": kwargs.get("sample_stats") and sample_stats})

    with monkeypatch.context() as patch:
        patch.setattr(scoring_module, "response_logits", spy)
        patch.setattr(data_module, "rollout", rollout)
        assert Engine(TrainSpec.model_validate(data), out).run() == ExitCode.OK
    return step_metrics(read_events(out)), final_weights(out), calls


def assert_same_run(a: dict, b: dict, wa: dict, wb: dict, lr: float, steps: int) -> None:
    """Metrics equal up to float rounding; weights within a small fraction of an Adam step. Adam divides each
    gradient by its running scale, so rounding-level gradient differences become weight differences of a
    small fraction of a step, while a wrong gradient moves nearly every weight by about lr. The exception is
    a weight whose gradient is itself at rounding level: m/√v is then about ±1 whatever its size, so its
    rounding picks the sign of a whole step. Which weights those are depends on the CPU's summation order
    (on an AVX-512 Xeon one of 65,536 gate_proj weights moved 1.4 x 0.5 % of a step; none did on AVX2), so
    the test bounds the mean difference and the share of weights beyond 0.5 % of a step, not the maximum:
    measured, the mean is under 1e-6 of lr x steps and the share at most 1 in 65,536; a wrong gradient gives a
    mean near lr x steps."""
    assert sorted(a) == sorted(b) == list(range(1, steps + 1))
    for step in a:
        assert a[step].keys() == b[step].keys()
        for key, value in a[step].items():
            assert value == pytest.approx(b[step][key], rel=1e-4, abs=1e-6), (step, key)
    step_total = lr * steps
    for name in wb:
        diff = (wa[name] - wb[name]).abs()
        assert float(diff.mean()) <= 1e-4 * step_total, name
        assert float((diff > 0.005 * step_total).float().mean()) <= 1e-4, name


@pytest.mark.parametrize("source", ["rollout", "forward"])
@pytest.mark.parametrize(
    ("algorithm", "micro_batch"),
    [("grpo_ds", 5), ("stare", 5), ("stare", 64), ("rsi_s", 5)],
    ids=["grpo_ds", "stare", "stare-one-pass", "rsi_s"],
)
def test_skipping_zero_advantage_rows_changes_nothing_but_the_work(
    tmp_path, monkeypatch, algorithm, micro_batch, source
):
    """Rows of groups with equal rewards (Â = 0) are scored without autograd, from the rollout's sampling
    statistics (no forward at all) or, without them, from a forward without autograd; the run is the same as
    one that runs every row forward and backward, up to float rounding (other matmul shapes)."""
    runs = {}
    for skip in (True, False):
        data = small_spec(
            algorithm={"name": algorithm},
            optim={"steps": 4, "micro_batch_size": micro_batch, "skip_zero_advantage": skip},
        )
        runs[skip] = run_counting_forwards(
            monkeypatch, data, tmp_path / f"skip-{skip}", sample_stats=source == "rollout"
        )

    (with_skip, w_skip, calls_skip), (without, w_full, calls_full) = runs[True], runs[False]
    zero_rows = [round(m["reward/zero_std_fraction"] * m["data/responses"]) for m in with_skip.values()]
    assert any(0 < z < 12 for z in zero_rows)  # the case the skip is for: some groups informative, some not
    assert_same_run(with_skip, without, w_skip, w_full, lr=1e-3, steps=4)
    # The skip is real: the skipped rows leave the forward with autograd, and are scored without autograd
    # beyond what the run without the skip does (its π_old pass) only when no rollout statistics stand in.
    no_grad_skip = sum(b for b, grad in calls_skip if not grad)
    no_grad_full = sum(b for b, grad in calls_full if not grad)
    expected = sum(z - (1 if z == 12 else 0) for z in zero_rows)  # one row keeps autograd in each step
    assert no_grad_skip - no_grad_full == (expected if source == "forward" else 0)
    grad_skip = sum(b for b, grad in calls_skip if grad)
    assert sum(b for b, grad in calls_full if grad) - grad_skip == expected


@pytest.mark.parametrize("ppo_epochs", [1, 2])
def test_on_policy_stare_reads_pi_old_off_the_rollout(tmp_path, monkeypatch, ppo_epochs):
    """On-policy STARE over several micro-batches needs π_old (gate, surprisal ranking) before the update:
    it reads the numbers generate recorded instead of running a no-grad pass over the batch, and the run is
    the one with the pass, up to float rounding. Off-policy (ppo_epochs 2) the pass stays."""
    data = small_spec(
        optim={"steps": 4, "micro_batch_size": 5, "skip_zero_advantage": False, "ppo_epochs": ppo_epochs}
    )
    rollout_run = run_counting_forwards(monkeypatch, data, tmp_path / "rollout")
    pass_run = run_counting_forwards(monkeypatch, data, tmp_path / "pass", sample_stats=False)
    assert_same_run(rollout_run[0], pass_run[0], rollout_run[1], pass_run[1], lr=1e-3, steps=4)
    assert any(m["stare/gate_on"] == 1.0 for m in rollout_run[0].values())  # the ranking really ran
    batch_rows = 4 * 12
    assert sum(b for b, grad in pass_run[2] if not grad) == batch_rows
    assert sum(b for b, grad in rollout_run[2] if not grad) == (0 if ppo_epochs == 1 else batch_rows)


def test_kl_penalty_to_the_reference_policy(tmp_path):
    """optim.kl_beta adds β·k3 to π_ref, the policy as RL starts (here: the step-0 checkpoint), frozen."""
    runs = {}
    for beta in (0.0, 0.5):
        out = tmp_path / f"beta-{beta}"
        data = small_spec(algorithm={"name": "grpo"}, optim={"kl_beta": beta, "steps": 3})
        assert Engine(TrainSpec.model_validate(data), out).run() == ExitCode.OK
        runs[beta] = _steps(out)
    with_kl, without = runs[0.5], runs[0.0]
    assert "kl/ref_k3" not in without[0]
    # Step 1 samples from π_ref itself: k3 and its gradient (1 − e^0) are exactly 0, so the step equals β = 0's.
    assert with_kl[0]["kl/ref_k3"] == 0.0
    assert with_kl[0]["loss/policy"] == without[0]["loss/policy"]
    assert all(m["kl/ref_k3"] > 0 for m in with_kl[1:])
    assert with_kl[1]["loss/policy"] != without[1]["loss/policy"]
    out = tmp_path / "beta-0.5"
    reference = load_file(str(out / REFERENCE_FILE))
    start = load_file(str(out / "checkpoints" / "step-000000" / "model" / "model.safetensors"))
    shared = reference.keys() & start.keys()
    assert len(shared) >= len(start) - 1  # tied embeddings may be stored under either name
    for name in shared:
        assert torch.equal(reference[name], start[name]), name


def test_resumed_run_keeps_its_kl_reference(tmp_path):
    spec = TrainSpec.model_validate(small_spec(algorithm={"name": "grpo"}, optim={"kl_beta": 0.5}))
    full = tmp_path / "full"
    assert Engine(spec, full).run() == ExitCode.OK
    part = tmp_path / "part"
    crash_after_then_resume(spec, part, 3)
    a, b = step_metrics(read_events(full)), step_metrics(read_events(part))
    assert a == b and all(a[s]["kl/ref_k3"] > 0 for s in (2, 3, 4))
    wa, wb = final_weights(full), final_weights(part)
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    (part / REFERENCE_FILE).unlink()
    with pytest.raises(FileNotFoundError, match="reference"):
        Engine(spec, part, resume=True).run()


def test_lora_kl_reference_is_the_base_model_with_adapters_off(tmp_path):
    data = small_spec(
        model={"name": "tiny-arith", "lora": {"r": 4, "alpha": 8}},
        algorithm={"name": "grpo"},
        optim={"kl_beta": 0.5, "steps": 3, "lr": 1e-2},
    )
    spec = TrainSpec.model_validate(data)
    out = tmp_path / "run"
    assert Engine(spec, out).run() == ExitCode.OK
    steps = _steps(out)
    assert steps[0]["kl/ref_k3"] == 0.0  # B = 0 at the start: the adapters add exactly nothing
    assert all(m["kl/ref_k3"] > 0 for m in steps[1:])
    assert not (out / REFERENCE_FILE.parent).exists()  # no copy of the model is kept

    # The same run resumed from step 2 reaches the same step 3: π_ref comes back without a file.
    part = tmp_path / "part"
    crash_after_then_resume(spec, part, 2)
    assert step_metrics(read_events(part)) == step_metrics(read_events(out))


@pytest.mark.parametrize(
    ("algorithm", "optim", "recorded"),
    [
        ("stare", {"micro_batch_size": 5, "skip_zero_advantage": False}, True),  # π_old for the gate
        ("stare", {"micro_batch_size": 12, "skip_zero_advantage": False}, False),  # one pass: its own
        ("stare", {"micro_batch_size": 5, "skip_zero_advantage": False, "ppo_epochs": 2}, False),
        ("grpo_ds", {"skip_zero_advantage": True}, True),  # rows with advantage 0
        ("grpo_ds", {"skip_zero_advantage": True, "kl_beta": 0.1}, False),  # no row is inert
        ("kl_cov", {"skip_zero_advantage": True}, False),
        ("grpo_ds", {"skip_zero_advantage": False}, False),
    ],
)
def test_rollouts_record_sampling_statistics_only_where_the_update_reads_them(
    tmp_path, algorithm, optim, recorded
):
    engine = Engine(
        TrainSpec.model_validate(small_spec(algorithm={"name": algorithm}, optim=optim)), tmp_path
    )
    engine.setup()
    assert engine.record_sample_stats is recorded
    batch, _ = engine.collect()
    assert batch.has_sample_stats is recorded
