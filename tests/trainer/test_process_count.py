"""The same job at 1 process and at 2 (torchrun, gloo, CPU) is the same run: each prompt samples from its own
stream (trainer.rollout.sampling), so the processes' shares of a step draw exactly what one process draws.

Four launches of the engine's own run loop (tests/trainer/process_count_worker.py: Engine.run as
`python -m trainer run` runs it, recording each process's samples and step metrics), module-scoped:
ddp × 1, ddp × 2 and fsdp2 × 2 for 3 steps with a checkpoint every step, and the ddp × 2 run resumed from
its step-1 checkpoint in 1 process (steps 2 and 3 redone at the other size). Asserted:
- step 1's samples (token ids of every response, by global prompt index) are the same at 1 and 2 processes
  under either strategy, and so are steps 2 and 3's (sampled from weights that differ by rounding only);
- the step losses (the processes' shares summed) agree within LOSS_TOL at every step, the token-mean
  entropy and the gradient norm within METRIC_TOL, the response counts and the lr exactly;
- the resumed run continues the 2-process run: its steps 2 and 3 draw the same samples and give the same
  losses (LOSS_TOL) as the uninterrupted 2-process run's.

Tolerance. Every comparison is float32 arithmetic on the same numbers in another order: the loss is a sum
of n per-token terms x_t = A_t · r_t / N (A the advantage, r the clipped ratio, N the step's token count),
split into per-process partial sums and micro-batches differently at 1 and 2 processes. Two orders of one
float32 sum differ by at most 2·γ(n)·Σ|x_t| with γ(n) = n·u/(1 − n·u), u = 2⁻²⁴ (Higham, ch. 4). Here
n ≤ prompts × G × max_new_tokens = 3 × 4 × 5 = 60 tokens, |A| ≤ √(G−1) = √3 for a group-normalised
advantage of G = 4 and r ≤ 1 + ε_high = 1.28 (grpo_ds), so Σ|x_t| ≤ 1.73 × 1.28 ≈ 2.2 and the bound is
2 × 60 × 6.0e-8 × 2.2 ≈ 1.6e-5. The ratio r itself is computed from log-probs of forwards whose padding and
batch shape differ (another reduction order in every matmul and softmax): on this 2-layer width-128 model
that moves each log-prob by a few float32 ulps of its size (|log p| ≲ 5, ulp 4.8e-7), r by ~1e-6
relative, and the loss by at most that times Σ|x_t|, another 2e-6. Steps 2 and 3 start from weights that
differ by the previous updates' reordering (AdamW's step is lr-sized, its rounding ~1e-7 × lr). LOSS_TOL =
2e-5 covers the sum. The token-mean entropy and the gradient norm are sums of the same kind over at most
60 tokens and the model's parameters, with the same forward differences; METRIC_TOL = 1e-4 (as
tests/trainer/test_fsdp2_engine.py derives it for ddp against fsdp2) is far below the step-to-step change
of each metric, which the test requires to exceed 10 × the tolerance. A flipped sampled token is not
rounding: the samples are compared exactly first. Measured (2026-12-03, 2 shared cores): step losses ≤ 2.5e-8
apart, entropy ≤ 1.6e-7, gradient norm ≤ 2.4e-7; the resumed run's steps equal the 2-process run's to
those figures, and the 1-process run's exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.test_engine import small_spec

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("process_count_worker.py")
SEED = 0  # step 1 has groups with mixed rewards: the first update moves the weights
STEPS = 3
LOSS_TOL = 2e-5
METRIC_TOL = 1e-4
CLOSE = ("entropy/mean", "actor/grad_norm")
EXACT = ("data/responses", "actor/lr")


def _spec(strategy: str, processes: int) -> dict[str, Any]:
    return small_spec(
        seed=SEED,
        algorithm={"name": "grpo_ds"},
        distributed={"strategy": strategy, "processes_per_node": processes},
        optim={"steps": STEPS, "micro_batch_size": 3, "grad_clip": 1.0},
        checkpoint={"interval": 1, "keep_last": 5},
    )


def _launch(tmp: Path, name: str, strategy: str, processes: int, *, resume_from: Path | None = None) -> Path:
    spec_path = tmp / f"{name}.json"
    spec_path.write_text(json.dumps(_spec(strategy, processes)))
    out = tmp / name
    args = [str(WORKER), str(spec_path), str(out)]
    if resume_from is not None:  # the finished run without what came after its step-1 checkpoint
        shutil.copytree(resume_from, out)
        for later in range(2, STEPS + 1):
            shutil.rmtree(out / "checkpoints" / f"step-{later:06d}")
        shutil.rmtree(out / "samples")
        shutil.rmtree(out / "metrics")
        args.append("--resume")
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*launcher, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = Path(tmp_path_factory.mktemp("process_count"))
    out = {
        "ddp×1": _launch(tmp, "ddp-1", "ddp", 1),
        "ddp×2": _launch(tmp, "ddp-2", "ddp", 2),
        "fsdp2×2": _launch(tmp, "fsdp2-2", "fsdp2", 2),
    }
    out["ddp×2→1"] = _launch(tmp, "ddp-2-resumed-1", "ddp", 1, resume_from=out["ddp×2"])
    return out


def _samples(out: Path, step: int) -> dict[str, list[list[int]]]:
    """Every process's responses of `step`, by global prompt index (each prompt on one process only)."""
    merged: dict[str, list[list[int]]] = {}
    for path in sorted((out / "samples").glob(f"step-{step}-rank-*.json")):
        share = json.loads(path.read_text())
        assert not set(share) & set(merged)
        merged.update(share)
    return merged


def _metrics(out: Path, step: int) -> dict[str, float]:
    """The step's metrics with loss/policy summed over the processes' shares (the step loss)."""
    ranks = [json.loads(p.read_text()) for p in sorted((out / "metrics").glob(f"step-{step}-rank-*.json"))]
    assert ranks, (out, step)
    return {**ranks[0], "loss/policy": sum(r["loss/policy"] for r in ranks)}


def _assert_same_step(one: dict[str, float], other: dict[str, float], where: str) -> None:
    assert abs(other["loss/policy"] - one["loss/policy"]) <= LOSS_TOL, (where, one["loss/policy"], other)
    for key in CLOSE:
        assert abs(other[key] - one[key]) <= METRIC_TOL, (where, key, one[key], other[key])
    for key in EXACT:
        assert other[key] == one[key], (where, key)


@pytest.mark.slow
def test_one_and_two_processes_draw_the_same_samples(runs: dict[str, Path]) -> None:
    for step in range(1, STEPS + 1):
        alone = _samples(runs["ddp×1"], step)
        assert len(alone) == 3 and all(len(responses) == 4 for responses in alone.values())
        for name in ("ddp×2", "fsdp2×2"):
            assert _samples(runs[name], step) == alone, (name, step)
        assert len(list((runs["ddp×2"] / "samples").glob(f"step-{step}-rank-*.json"))) == 2
    assert _samples(runs["ddp×1"], 1) != _samples(runs["ddp×1"], 2)  # another step, other prompts/streams


@pytest.mark.slow
def test_one_and_two_processes_give_the_same_losses(runs: dict[str, Path]) -> None:
    for step in range(1, STEPS + 1):
        one = _metrics(runs["ddp×1"], step)
        for name in ("ddp×2", "fsdp2×2"):
            _assert_same_step(one, _metrics(runs[name], step), f"{name} step {step}")
    # The tolerances are far below what a step changes, so a wrong loss or update cannot pass.
    first, last = _metrics(runs["ddp×1"], 1), _metrics(runs["ddp×1"], STEPS)
    assert abs(last["loss/policy"] - first["loss/policy"]) > 100 * LOSS_TOL
    assert abs(last["entropy/mean"] - first["entropy/mean"]) > 10 * METRIC_TOL


@pytest.mark.slow
def test_a_two_process_run_resumed_at_one_continues_its_curve(runs: dict[str, Path]) -> None:
    resumed, uninterrupted = runs["ddp×2→1"], runs["ddp×2"]
    assert sorted(p.name for p in (resumed / "metrics").iterdir()) == [
        f"step-{step}-rank-0.json" for step in range(2, STEPS + 1)
    ]  # one process, steps 2 and 3 only
    for step in range(2, STEPS + 1):
        assert _samples(resumed, step) == _samples(uninterrupted, step), step
        _assert_same_step(_metrics(uninterrupted, step), _metrics(resumed, step), f"resumed step {step}")
    events = [json.loads(line) for line in (resumed / "events.jsonl").read_text().splitlines()]
    numbered = [(e["type"], e["step"]) for e in events if e["type"] in ("step", "resumed")]
    assert numbered == [("step", 1), ("resumed", 1), ("step", 2), ("step", 3)]
