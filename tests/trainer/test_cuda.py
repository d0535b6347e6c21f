"""The trainer on a CUDA device: kernels, losses and the whole engine. Skipped where torch sees no GPU
(CI has none); `bench/bench_gpu.py` runs this file first on a GPU machine."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from contract.spec import TrainSpec
from trainer.algos.advantages import compute_advantages
from trainer.algos.kernels import token_stats_from_logits, token_stats_reference
from trainer.algos.losses import POLICY_LOSSES, PolicyLossInputs, compute_policy_loss, make_loss_params
from trainer.checkpoints import latest_checkpoint
from trainer.engine import Engine, ExitCode

from .test_engine import small_spec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_on_cuda_match_the_reference(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn((96, 5003), generator=gen) * 3).to(dtype)
    targets = torch.randint(0, 5003, (96,), generator=gen)
    ref = token_stats_reference(logits.float(), targets, temperature=0.7)
    dev_logits = logits.to(CUDA).detach().clone().requires_grad_(True)
    got = token_stats_from_logits(dev_logits, targets.to(CUDA), temperature=0.7, chunk_rows=40)
    assert got.entropy is not None and got.correction is not None and ref.entropy is not None
    torch.testing.assert_close(got.logprob.cpu(), ref.logprob, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got.entropy.cpu(), ref.entropy, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got.correction.cpu(), ref.correction, rtol=1e-4, atol=1e-4)
    g = torch.randn(96, generator=gen)
    (got.logprob * g.to(CUDA)).sum().backward()
    cpu_logits = logits.detach().float().clone().requires_grad_(True)
    (token_stats_reference(cpu_logits, targets, temperature=0.7).logprob * g).sum().backward()
    assert dev_logits.grad is not None and cpu_logits.grad is not None
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(dev_logits.grad.float().cpu(), cpu_logits.grad, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", [n for n in POLICY_LOSSES.names() if n != "clip_cov"])
def test_every_loss_gives_the_same_value_and_gradient_on_cuda(name: str) -> None:
    gen = torch.Generator().manual_seed(2)
    b, t = 12, 9
    mask = (torch.rand((b, t), generator=gen) > 0.2).float()
    rewards = (torch.rand(b, generator=gen) > 0.5).float()
    adv, _ = compute_advantages("grpo", rewards, torch.arange(b) // 4)
    old = -3 * torch.rand((b, t), generator=gen)
    new = old + 0.1 * torch.randn((b, t), generator=gen)
    entropy = torch.rand((b, t), generator=gen) * 2
    ref_lp = old + 0.05 * torch.randn((b, t), generator=gen)
    params = make_loss_params(name)
    results = []
    for device in ("cpu", "cuda"):
        leaf = new.clone().to(device).requires_grad_(True)
        inputs = PolicyLossInputs(
            logprob=leaf,
            old_logprob=old.to(device),
            advantages=adv.to(device),
            response_mask=mask.to(device),
            entropy=entropy.to(device),
            ref_logprob=ref_lp.to(device),
        )
        loss, metrics = compute_policy_loss(name, inputs, params)
        loss.backward()
        assert leaf.grad is not None
        results.append((loss.detach().cpu(), leaf.grad.cpu(), {k: float(v) for k, v in metrics.items()}))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-5, atol=1e-7)
    assert results[1][2].keys() == results[0][2].keys()
    for key, value in results[0][2].items():
        assert results[1][2][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algorithm", ["stare", "grpo"])
def test_engine_trains_checkpoints_and_resumes_on_cuda(tmp_path: Path, algorithm: str) -> None:
    data = small_spec(algorithm={"name": algorithm}, optim={"steps": 4})
    if algorithm == "stare":
        data["algorithm"]["gate"] = {"target_entropy": 100.0}  # the gate ranks tokens every step
    spec = TrainSpec.model_validate(data)
    out = tmp_path / "run"
    engine = Engine(spec, out, progress=False)
    assert engine.device.type == "cuda"
    assert engine.run() == ExitCode.OK
    assert next(engine.model.parameters()).device.type == "cuda"
    steps = [e for e in _events(out) if e["type"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4]
    for event in steps:
        for key, value in event["metrics"].items():
            assert math.isfinite(value) or key == "actor/grad_norm", key
    if algorithm == "stare":
        assert all(e["metrics"]["stare/gate_on"] == 1.0 for e in steps)
    latest = latest_checkpoint(out / "checkpoints")
    assert latest is not None and latest.name == "step-000004"
    model = AutoModelForCausalLM.from_pretrained(latest / "model")
    assert sum(p.numel() for p in model.parameters()) > 0

    # Resume on the GPU from the latest checkpoint (step 4) with a longer schedule: steps 5 and 6 follow.
    longer = TrainSpec.model_validate({**data, "optim": {**data["optim"], "steps": 6}})
    assert Engine(longer, out, resume=True, progress=False).run() == ExitCode.OK
    events = _events(out)
    assert any(e["type"] == "resumed" and e["step"] == 4 for e in events)
    assert [e["step"] for e in events if e["type"] == "step"] == [1, 2, 3, 4, 5, 6]
    assert events[-1]["type"] == "finished"


def test_sampling_statistics_on_cuda_match_the_training_pass() -> None:
    """The per-token numbers recorded during generation on the GPU (Triton kernel where available) are the
    training forward's, up to float rounding, in fp32."""
    from trainer.models import load_model_and_tokenizer
    from trainer.policy.scoring import response_stats
    from trainer.rollout.batch import rollout
    from trainer.rollout.generation import HFGenerate
    from trainer.tasks.sources import Example

    model, tokenizer = load_model_and_tokenizer("tiny-arith", seed=3)
    model = model.to(CUDA).eval()
    spec = TrainSpec.model_validate(
        small_spec(sampling={"group_size": 3, "temperature": 0.8, "top_p": 0.9, "max_new_tokens": 6})
    )
    examples = [Example(prompt=f"{a}+{b}=", answer=str(a + b)) for a, b in [(1, 2), (30, 4), (55, 66)]]
    torch.manual_seed(0)
    batch = rollout(
        model, tokenizer, examples, 0, spec, sample_stats=True, engine=HFGenerate(model, tokenizer)
    )
    assert batch.sample_logprob is not None and batch.sample_entropy is not None
    with torch.no_grad():
        logprob, entropy, _ = response_stats(
            model, batch.to(CUDA), torch.arange(batch.size, device=CUDA), 0.8, with_entropy=True
        )
    assert entropy is not None
    mask = batch.response_mask.bool()
    torch.testing.assert_close(batch.sample_logprob[mask], logprob.cpu()[mask], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(batch.sample_entropy[mask], entropy.cpu()[mask], rtol=1e-4, atol=1e-4)
