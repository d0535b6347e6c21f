"""π_old's optimisations give its documented path's numbers (docs/ALGORITHMS.md §4.14), on fixed inputs:
the one-pass path bit for bit; the sampling record up to float rounding (generation runs other matmul
shapes, with a KV cache)."""

from __future__ import annotations

import torch

from contract.spec import TrainSpec
from trainer.data import load_examples
from trainer.models import load_model_and_tokenizer
from trainer.rollout import rollout
from trainer.update import measure_old_policy, no_grad_pass, one_pass


def _spec(**optim: object) -> TrainSpec:
    return TrainSpec.model_validate(
        {
            "seed": 2,
            "model": {"name": "tiny-arith"},
            "task": {"source": "arithmetic", "train_size": 8, "eval_size": 0},
            "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
            "algorithm": {"name": "stare"},
            "sampling": {"group_size": 3, "max_new_tokens": 5},
            "optim": {"steps": 1, "prompts_per_step": 3, "micro_batch_size": 64, **optim},
        }
    )


def _batch(spec: TrainSpec, *, sample_stats: bool):  # type: ignore[no-untyped-def]
    model, tokenizer = load_model_and_tokenizer("tiny-arith", seed=0)
    prompts, _ = load_examples(spec)
    examples, first = prompts.take(3)
    torch.manual_seed(4)
    model.eval()
    batch = rollout(model, tokenizer, examples, first, spec, sample_stats=sample_stats)
    model.train()
    return model, batch


def test_the_one_pass_path_is_the_no_grad_pass_bit_for_bit() -> None:
    spec = _spec()
    model, batch = _batch(spec, sample_stats=False)
    reference = no_grad_pass(model, batch, spec.sampling.temperature, spec.optim.micro_batch_size)
    fast = one_pass(model, batch, None, spec.sampling.temperature, entropy_grad=False)
    for name in ("logprob", "entropy", "correction"):
        assert torch.equal(getattr(fast, name), getattr(reference, name)), name
    assert fast.first_pass is not None and fast.first_pass[0].requires_grad  # the update's graph
    chosen = measure_old_policy(
        model, batch, None, spec=spec, n_micro=1, deterministic=True, entropy_grad=False
    )
    assert chosen.first_pass is not None  # the engine takes it where it applies


def test_the_sampling_record_is_the_no_grad_pass_up_to_rounding() -> None:
    spec = _spec(micro_batch_size=4)
    model, batch = _batch(spec, sample_stats=True)
    reference = no_grad_pass(model, batch, spec.sampling.temperature, spec.optim.micro_batch_size)
    chosen = measure_old_policy(
        model, batch, None, spec=spec, n_micro=3, deterministic=True, entropy_grad=False
    )
    assert chosen.ratio_logprob is None and chosen.logprob is batch.sample_logprob  # read, no pass
    mask = batch.response_mask.bool()
    for name in ("logprob", "entropy", "correction"):
        got, want = getattr(chosen, name)[mask], getattr(reference, name)[mask]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)


def test_off_policy_reads_the_documented_pass() -> None:
    spec = _spec(ppo_epochs=2)
    model, batch = _batch(spec, sample_stats=True)
    chosen = measure_old_policy(
        model, batch, None, spec=spec, n_micro=1, deterministic=True, entropy_grad=False
    )
    reference = no_grad_pass(model, batch, spec.sampling.temperature, spec.optim.micro_batch_size)
    assert chosen.ratio_logprob is not None and torch.equal(chosen.ratio_logprob, reference.logprob)
