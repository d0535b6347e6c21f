"""An fsdp2 job resumed at another number of processes, through `python -m trainer run --resume`.

Three ways: a job run by 2 fsdp2 processes (torchrun) resumes from its step-1 checkpoint in 1 process, a
job run by 1 fsdp2 process resumes from its step-1 checkpoint in 2, and a job run by 2 ddp processes
resumes under fsdp2 in 1 (both strategies write one format, DCP shards keyed by parameter name). The
step-2 checkpoint is removed first, so the resumed run redoes step 2 at the other size. Asserted:
- the shards restore the checkpoint's weights: restored into a model initialised otherwise, the logits equal
  those of the checkpoint's consolidated model/ folder (1e-6). Checked on a fresh (initialised) model,
  where a broken restore shows (the resuming engine builds its model on the meta device and reads the
  shards into it: test_strategy.py);
- the resumed step 2 sampled from those weights: each process's share of step 2's prompts, generated here
  from model/ with the step's seed, gives rank 0's rewards and lengths and the step's token-mean entropy
  (over both shares) that the resumed run logged; every resumed process held the restored weights;
- AdamW's step count is 2 in the resumed run's step-2 checkpoint (a fresh optimizer counts 1), the lr
  schedule continued (step 2's lr is the warm-up's third value; a fresh scheduler gives the second), the
  data cursor moved on, and the STARE gate (adaptive W/M) is the step-1 state advanced by step 2's H̄
  (advancing a fresh state gives another one);
- the events hold each step once, in order, with the `resumed` event between steps 1 and 2;
- step 2's loss and entropy are finite.
Seed 0: both step-1 batches hold rewarded and unrewarded responses, so step 1 really moves the weights
(checked: the step-1 logits differ from the step-0 ones), and the weight checks cannot pass on the start.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from contract.spec import TrainSpec
from tests.trainer.launch import run_trainer
from tests.trainer.test_engine import small_spec
from trainer.policy.update import lr_factor

WARMUP_STEPS = 3  # the lr still changes between the steps, so its position is observable
IDS = torch.tensor([[1, 5, 6, 7, 8, 9, 10]])


def _spec(processes: int, strategy: str = "fsdp2") -> dict:
    return small_spec(
        seed=0,
        algorithm={"name": "stare", "gate": {"target_entropy": 5.0, "adaptive": True}},
        distributed={"strategy": strategy, "processes_per_node": processes},
        optim={"steps": 2, "micro_batch_size": 12, "grad_clip": 1.0, "warmup_steps": WARMUP_STEPS},
        checkpoint={"interval": 1, "keep_last": 5},
    )


def _run(
    tmp: Path, name: str, processes: int, *, strategy: str = "fsdp2", resume_from: Path | None = None
) -> Path:
    """`python -m trainer run` in `processes` processes (torchrun above one); resume_from: a finished
    run's folder, copied without its step-2 checkpoint and resumed."""
    spec = _spec(processes, strategy)
    return run_trainer(tmp, name, spec, processes=processes, resume_from=resume_from, timeout=300)


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def _state(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "state.json").read_text())


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def _model_logits(folder: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    return _logits(AutoModelForCausalLM.from_pretrained(folder))


def _restored_in_this_process(checkpoint: Path, tmp: Path):
    """An fsdp2 engine at one process with freshly initialised weights, then the checkpoint restored into
    it (weights, optimizer, scheduler, engine state) as a resume does. Returns the engine and its logits
    before and after the restore."""
    from trainer.engine import Engine

    engine = Engine(TrainSpec.model_validate(_spec(1)), tmp / "probe")
    engine.setup(None)
    with engine.strategy.full_weights(engine.model) as full:
        before = _logits(full)
    engine._restore(checkpoint)
    with engine.strategy.full_weights(engine.model) as full:
        after = _logits(full)
    return engine, before, after


def _step2_shares(checkpoint: Path, processes: int) -> list:
    """Each process's step-2 rollouts as the resumed run must have sampled them: its share of the step's
    prompts (from the checkpoint's cursor), generated from the checkpoint's model/ with the step's seed."""
    from trainer.data import collect, load_examples
    from trainer.engine import seed_everything, step_seed
    from trainer.models import load_model_and_tokenizer
    from trainer.rollout.vllm_engine import build_rollout_engine

    spec = TrainSpec.model_validate(_spec(processes))
    model, tokenizer = load_model_and_tokenizer(str(checkpoint / "model"))  # model/'s weights
    model.eval()
    rollout_engine = build_rollout_engine(spec, model, tokenizer)
    prompts, _ = load_examples(spec)
    shares = []
    for rank in range(processes):
        prompts.cursor = int(_state(checkpoint)["cursor"])
        seed_everything(step_seed(spec.seed, 2))
        batch, _ = collect(
            model, tokenizer, prompts, spec, rank=rank, world=processes, sample_stats=False,
            reduce=lambda value, *_: torch.tensor(value), engine=rollout_engine, step=2,
        )  # fmt: skip
        shares.append(batch)
    return shares


def _token_mean_entropy(checkpoint: Path, shares: list, temperature: float) -> float:
    from trainer.models import load_model_and_tokenizer
    from trainer.policy.scoring import response_stats

    model, _ = load_model_and_tokenizer(str(checkpoint / "model"))
    total, tokens = 0.0, 0.0
    with torch.no_grad():
        for batch in shares:
            _, entropy, _ = response_stats(
                model, batch, torch.arange(batch.size), temperature, with_entropy=True
            )
            assert entropy is not None
            total += float((entropy * batch.response_mask).sum())
            tokens += float(batch.response_mask.sum())
    return total / tokens


def _optimizer_steps(checkpoint: Path, tmp: Path) -> set[float]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    path = tmp / f"{checkpoint.parent.parent.name}-optimizer.pt"
    dcp_to_torch_save(checkpoint / "sharded", path)
    state = torch.load(path, weights_only=False)["optimizer"]["state"]
    return {float(s["step"]) for s in state.values()}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("written_by", "written_under", "resumed_by"),
    [(2, "fsdp2", 1), (1, "fsdp2", 2), (2, "ddp", 1)],
    ids=["2to1", "1to2", "ddp2-to-fsdp2x1"],
)
def test_fsdp2_checkpoint_resumes_at_another_process_count(tmp_path, written_by, written_under, resumed_by):
    original = _run(tmp_path, "original", written_by, strategy=written_under)
    resumed = _run(tmp_path, "resumed", resumed_by, resume_from=original)
    checkpoints = original / "checkpoints"
    step1 = checkpoints / "step-000001"
    saved = _state(step1)
    layout = json.loads((step1 / "distributed.json").read_text())
    assert (layout["world_size"], layout["strategy"]) == (written_by, written_under)

    # The shards hold model/'s weights, and step 1 moved them (the comparison is not with the start).
    engine, fresh_logits, restored_logits = _restored_in_this_process(step1, tmp_path)
    consolidated = _model_logits(step1 / "model")
    torch.testing.assert_close(restored_logits, consolidated, rtol=0, atol=1e-6)
    assert (consolidated - _model_logits(checkpoints / "step-000000" / "model")).abs().max() > 1e-4
    assert (fresh_logits - consolidated).abs().max() > 1e-4
    assert engine.step == 1 and engine.scheduler.last_epoch == 1
    assert {float(s["step"]) for s in engine.optimizer.state.values()} == {1.0}

    # Step numbering: step 1 from the original run, `resumed`, step 2 once.
    events = _events(resumed)
    numbered = [(e["type"], e["step"]) for e in events if e["type"] in ("step", "resumed")]
    assert numbered == [("step", 1), ("resumed", 1), ("step", 2)]
    step2 = next(e["metrics"] for e in events if e["type"] == "step" and e["step"] == 2)
    assert math.isfinite(step2["loss/policy"]) and math.isfinite(step2["entropy/mean"])

    # Step 2 sampled from the restored weights in every resumed process.
    shares = _step2_shares(step1, resumed_by)
    assert step2["data/responses"] == sum(b.size for b in shares)
    assert step2["reward/mean"] == float(shares[0].rewards.mean())
    assert step2["response/length_mean"] == float(shares[0].response_lengths.mean())
    temperature = TrainSpec.model_validate(_spec(1)).sampling.temperature
    assert abs(step2["entropy/mean"] - _token_mean_entropy(step1, shares, temperature)) <= 1e-5

    # The optimizer, the schedule, the cursor and the controller carried over.
    after = resumed / "checkpoints" / "step-000002"
    assert _optimizer_steps(after, tmp_path) == {2.0}
    lr = _spec(1)["optim"]["lr"]
    assert step2["actor/lr"] == pytest.approx(lr * lr_factor("constant", 2, warmup_steps=3, steps=2))
    assert step2["actor/lr"] != pytest.approx(lr * lr_factor("constant", 1, warmup_steps=3, steps=2))
    state2 = _state(after)
    assert state2["step"] == 2 and state2["cursor"] == saved["cursor"] + 3
    from trainer.algos.control import StepStatistics

    h_bar = StepStatistics(batch_entropy=step2["entropy/mean"])
    engine.controllers.update(h_bar)
    engine.controllers.metrics(h_bar)  # advances the stability counters, as the step's metrics do
    advanced = engine.controllers.state_dict()
    assert state2["controllers"] == advanced["controllers"]
    assert state2["stability"] == advanced["stability"]
    gate = engine.controllers.running[0].bound
    from_fresh = gate.update(gate.initial_state(), h_bar.batch_entropy)
    assert state2["controllers"]["stare_gate"] != from_fresh.to_dict()
