"""Rollouts on the tiny model: generate's tensors can enter a training graph, texts match per-row decoding,
rewards follow the verifier; the engine's prompt order is the seeded per-epoch permutation."""

from __future__ import annotations

import torch

from trainer.engine import Engine, response_stats
from trainer.models import load_model_and_tokenizer
from trainer.rollout import generate, rollout
from trainer.spec import TrainSpec
from trainer.tasks import Example
from trainer.verifiers import score


def tiny_spec(**optim: object) -> TrainSpec:
    return TrainSpec.model_validate(
        {
            "seed": 5,
            "model": {"name": "tiny-arith"},
            "task": {"source": "arithmetic", "train_size": 12, "eval_size": 0},
            "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
            "algorithm": {"name": "grpo"},
            "sampling": {"group_size": 3, "max_new_tokens": 5},
            "optim": {"lr": 1e-3, "steps": 1, "prompts_per_step": 5, **optim},
        }
    )


def test_generated_tensors_are_ordinary_tensors_that_a_training_pass_can_save():
    # generate samples under inference mode; what it returns must not be an inference tensor, or the
    # embedding (which saves its indices for backward) would refuse it in the training forward.
    model, tokenizer = load_model_and_tokenizer("tiny-arith", seed=0)
    torch.manual_seed(0)
    out = generate(
        model, tokenizer, ["12+3=", "7+45="], num_samples=3, temperature=1.0, top_p=1.0, max_new_tokens=5
    )
    assert not any(t.is_inference() for t in out[:4])
    spec = tiny_spec()
    examples = [Example(prompt="12+3=", answer="15"), Example(prompt="7+45=", answer="52")]
    torch.manual_seed(0)
    batch = rollout(model, tokenizer, examples, 0, spec)
    assert torch.equal(batch.input_ids, out[0])  # same seed, same samples
    model.train()
    logprob, _, _ = response_stats(model, batch, torch.arange(batch.size), 1.0, with_entropy=True)
    (logprob * batch.response_mask).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_rollout_texts_and_rewards_follow_each_row():
    model, tokenizer = load_model_and_tokenizer("tiny-arith", seed=1)
    spec = tiny_spec()
    examples = [Example(prompt=f"{a}+{b}=", answer=str(a + b)) for a, b in [(1, 2), (30, 4), (55, 66)]]
    torch.manual_seed(2)
    batch = rollout(model, tokenizer, examples, 10, spec)
    g = spec.sampling.group_size
    responses = batch.input_ids[:, batch.prompt_length :]
    for i, text in enumerate(batch.texts):
        n = int(batch.response_mask[i].sum())
        assert text == tokenizer.decode(responses[i, :n], skip_special_tokens=True)
        expected = score("numeric", text, examples[i // g], spec.verifier.params)
        assert float(batch.correct[i]) == expected
        assert float(batch.rewards[i]) == expected  # binary shaping, no overlong penalty for grpo
    assert batch.group_ids.tolist() == [10, 10, 10, 11, 11, 11, 12, 12, 12]


def test_prompt_order_is_the_seeded_permutation_of_each_epoch():
    spec = tiny_spec()
    engine = Engine.__new__(Engine)  # the data methods only
    engine.spec = spec
    engine.cursor = 0
    engine._load_data()
    size = len(engine.train_examples)
    taken = []
    for _ in range(6):  # 30 prompts: two epoch boundaries, one inside a call
        examples, start = engine._take_prompts(spec.optim.prompts_per_step)
        assert start == len(taken)
        taken.extend(examples)
    expected = []
    for pos in range(len(taken)):
        epoch, offset = divmod(pos, size)
        order = torch.randperm(size, generator=torch.Generator().manual_seed(spec.seed * 7_777 + epoch))
        expected.append(engine.train_examples[int(order[offset])])
    assert taken == expected
    assert taken[:size] != taken[size : 2 * size]  # each epoch has its own order
