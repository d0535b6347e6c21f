"""Rollouts on the tiny model: generate's tensors can enter a training graph, texts match per-row decoding,
rewards follow the verifier; the engine's prompt order is the seeded per-epoch permutation."""

from __future__ import annotations

import pytest
import torch

from contract.spec import TrainSpec
from trainer.data import load_examples
from trainer.models import apply_lora, load_model_and_tokenizer
from trainer.policy.scoring import response_stats
from trainer.rollout.batch import SampledTokenStats, concat_rollouts, generate, rollout
from trainer.rollout.generation import HFGenerate
from trainer.tasks.sources import Example
from trainer.tasks.verifiers import score


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
    batch = rollout(model, tokenizer, examples, 0, spec, engine=HFGenerate(model, tokenizer))
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
    batch = rollout(model, tokenizer, examples, 10, spec, engine=HFGenerate(model, tokenizer))
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
    prompts, _ = load_examples(spec)
    size = len(prompts.examples)
    taken = []
    for _ in range(6):  # 30 prompts: two epoch boundaries, one inside a call
        examples, start = prompts.take(spec.optim.prompts_per_step)
        assert start == len(taken)
        taken.extend(examples)
    expected = []
    for pos in range(len(taken)):
        epoch, offset = divmod(pos, size)
        order = torch.randperm(size, generator=torch.Generator().manual_seed(spec.seed * 7_777 + epoch))
        expected.append(prompts.examples[int(order[offset])])
    assert taken == expected
    assert taken[:size] != taken[size : 2 * size]  # each epoch has its own order


@pytest.mark.parametrize(
    ("group_size", "temperature", "top_p", "lora"),
    [(3, 1.0, 1.0, False), (3, 0.7, 0.8, False), (1, 1.3, 1.0, False), (3, 1.0, 1.0, True)],
    ids=["shared-prompt-cache", "tempered-top-p", "no-shared-cache", "lora"],
)
def test_sampling_statistics_are_the_training_pass_values(group_size, temperature, top_p, lora):
    """The log-prob, entropy and C recorded from generate's own forward passes equal what the training
    forward computes for the same tokens, up to float rounding, whatever top-p did to the sampling."""
    model, tokenizer = load_model_and_tokenizer("tiny-arith", seed=3)
    if lora:
        model = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=None)
        with torch.no_grad():  # adapters that change the policy (peft starts them at B = 0)
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.5)
    # A frequent token as EOS, so that rows stop at different lengths (and masked positions exist).
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("1")
    spec = TrainSpec.model_validate(
        {
            **tiny_spec().model_dump(),
            "sampling": {
                "group_size": group_size,
                "temperature": temperature,
                "top_p": top_p,
                "max_new_tokens": 7,
            },
        }
    )
    examples = [
        Example(prompt=f"{a}+{b}=", answer=str(a + b)) for a, b in [(1, 2), (30, 4), (55, 66), (9, 10)]
    ]
    torch.manual_seed(0)
    batch = rollout(
        model, tokenizer, examples, 0, spec, sample_stats=True, engine=HFGenerate(model, tokenizer)
    )
    torch.manual_seed(0)
    plain = rollout(model, tokenizer, examples, 0, spec, engine=HFGenerate(model, tokenizer))
    assert torch.equal(batch.input_ids, plain.input_ids)  # recording does not change what is sampled
    assert not plain.has_sample_stats
    lengths = batch.response_lengths
    assert lengths.min() < lengths.max() and bool(batch.truncated.any())
    with torch.no_grad():
        logprob, entropy, correction = response_stats(
            model, batch, torch.arange(batch.size), temperature, with_entropy=True
        )
    mask = batch.response_mask.bool()
    for recorded, computed in (
        (batch.sample_logprob, logprob),
        (batch.sample_entropy, entropy),
        (batch.sample_correction, correction),
    ):
        assert recorded is not None and computed is not None
        assert recorded.shape == batch.response_mask.shape and not recorded.is_inference()
        torch.testing.assert_close(recorded[mask], computed[mask], rtol=1e-5, atol=1e-5)
        assert bool((recorded[~mask] == 0).all())
    assert float(batch.sample_entropy[mask].min()) > 0.1  # a real distribution, not a degenerate one


def test_sampling_statistics_follow_rows_through_select_and_concat():
    model, tokenizer = load_model_and_tokenizer("tiny-arith", seed=4)
    spec = tiny_spec()
    torch.manual_seed(1)
    a = rollout(
        model,
        tokenizer,
        [Example(prompt="1+2=", answer="3")],
        0,
        spec,
        sample_stats=True,
        engine=HFGenerate(model, tokenizer),
    )
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("1")
    b = rollout(
        model,
        tokenizer,
        [Example(prompt="123+45=", answer="168")],
        1,
        spec,
        sample_stats=True,
        engine=HFGenerate(model, tokenizer),
    )
    joined = concat_rollouts([a, b], tokenizer.pad_token_id)
    width = joined.response_mask.shape[1]
    assert joined.sample_logprob is not None and joined.sample_logprob.shape == (a.size + b.size, width)
    for part, rows in ((a, slice(0, a.size)), (b, slice(a.size, None))):
        assert part.sample_logprob is not None
        n = part.response_mask.shape[1]
        assert torch.equal(joined.sample_logprob[rows, :n], part.sample_logprob)
        assert bool((joined.sample_logprob[rows, n:] == 0).all())
    picked = joined.select(torch.tensor([3, 0]))
    assert picked.sample_entropy is not None and joined.sample_entropy is not None
    assert torch.equal(picked.sample_entropy, joined.sample_entropy[[3, 0]])
    assert picked.texts == [joined.texts[3], joined.texts[0]]
    # Without statistics on every part, the joined rollout has none (never half-filled).
    assert not concat_rollouts(
        [a, rollout(model, tokenizer, a_examples(), 2, spec, engine=HFGenerate(model, tokenizer))], 0
    ).has_sample_stats


def a_examples() -> list[Example]:
    return [Example(prompt="4+4=", answer="8")]


def test_sampling_statistics_do_not_depend_on_how_steps_are_buffered():
    model, tokenizer = load_model_and_tokenizer("tiny-arith", seed=2)
    results = []
    for buffer_bytes in (1, 3 * 4 * len(tokenizer) * 6, 2**30):  # every step, every ~3 steps, once
        recorder = SampledTokenStats(0.9, buffer_bytes=buffer_bytes)
        torch.manual_seed(0)
        ids, _, mask, _, p_len = generate(
            model,
            tokenizer,
            ["1+2=", "30+4="],
            num_samples=3,
            temperature=0.9,
            top_p=1.0,
            max_new_tokens=8,
            recorder=recorder,
        )
        stats = recorder.finish(ids[:, p_len:], mask)
        assert stats is not None and stats[0].shape == (6, 8)
        results.append(stats)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
