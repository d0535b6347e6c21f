"""Each prompt's samples come from its own stream (trainer.rollout.sampling), named by (job seed, purpose, step,
dynamic-sampling round, the prompt's index in the step's batch):
- the seed derivation is a stable hash (a fixed value, the same in any process) and differs by every part;
- HF generate's sampler has transformers' maths (temperature, top-p nucleus, a categorical draw): the same
  nucleus as transformers' top-p warper, and draw frequencies within 6 standard errors of its probabilities;
- a prompt's samples are the same alone or in a batch with others at another index (different padding),
  and differ with another seed;
- a step's samples are the same at 1, 2 and 3 processes (each process's share of the prompts, in this
  process: the multi-process launches are tests/trainer/test_process_count.py), and evaluation's too.
"""

from __future__ import annotations

import copy
import itertools
import math
import threading

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopPLogitsWarper

from contract.spec import TrainSpec
from tests.trainer.test_engine import small_spec
from trainer.data import collect, load_examples
from trainer.engine import Engine, seed_everything
from trainer.models import load_model_and_tokenizer
from trainer.policy import placement
from trainer.rollout.generation import HFGenerate
from trainer.rollout.sampling import SampleStreams, SeededSampler, nucleus, stream_seed, turn_seeds

DS_STEP = 1  # a step whose dynamic sampling needs more than one round (asserted)


def test_the_seed_derivation_is_a_fixed_stable_hash():
    # SHA-256 of "3/sample/train/1/0/0", its first 8 bytes big-endian, shifted to 62 bits: the same value
    # in every process and Python version (Python's hash() of a str is salted per process).
    assert stream_seed(3, "sample", "train", 1, 0, 0) == 1066059746332166129
    assert SampleStreams(3, "train", 1).prompt_seeds([0]) == [1066059746332166129]
    base = SampleStreams(3, "train", 1, round=0)
    variants = {
        "base": base.prompt_seeds([5])[0],
        "prompt": base.prompt_seeds([6])[0],
        "step": SampleStreams(3, "train", 2, round=0).prompt_seeds([5])[0],
        "round": SampleStreams(3, "train", 1, round=1).prompt_seeds([5])[0],
        "purpose": SampleStreams(3, "eval", 1, round=0).prompt_seeds([5])[0],
        "job seed": SampleStreams(4, "train", 1, round=0).prompt_seeds([5])[0],
    }
    assert len(set(variants.values())) == len(variants), variants
    assert all(0 <= s < 2**62 for s in variants.values())
    # vLLM seeds the i-th of a request's n samples with seed + i: neighbouring prompts' seeds are far apart.
    seeds = sorted(base.prompt_seeds(range(256)))
    assert min(b - a for a, b in itertools.pairwise(seeds)) > 2**20
    # Multi-turn: a row's turn seeds differ by sample and by turn.
    rows = turn_seeds([11, 12], num_samples=2, turn=0) + turn_seeds([11, 12], num_samples=2, turn=1)
    assert len(set(rows)) == 8


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 1.0])
def test_the_nucleus_is_transformers_top_p(top_p):
    scores = torch.randn(16, 300, generator=torch.Generator().manual_seed(1)) * 3
    ours = torch.isfinite(nucleus(scores, top_p))
    theirs = torch.isfinite(TopPLogitsWarper(top_p=top_p)(None, scores.clone()))  # type: ignore[arg-type]
    assert torch.equal(ours, theirs)
    assert ours.sum(-1).min() >= 1


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (1.5, 0.8)])
def test_the_draws_follow_transformers_sampling_distribution(temperature, top_p):
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    warped = TemperatureLogitsWarper(temperature)(None, logits.clone())  # type: ignore[arg-type]
    expected = TopPLogitsWarper(top_p=top_p)(None, warped).softmax(-1)[0]  # type: ignore[arg-type]
    n = 40_000
    sampler = SeededSampler([123], samples_per_seed=n, temperature=temperature, top_p=top_p)
    tokens = sampler.draw(logits.expand(n, -1))
    frequencies = torch.bincount(tokens, minlength=logits.shape[1]).double() / n
    for p, f in zip(expected.tolist(), frequencies.tolist()):
        standard_error = math.sqrt(max(p * (1 - p), 1e-12) / n)
        assert abs(f - p) <= 6 * standard_error + 1e-12, (expected, frequencies)
    # The processor form hands generate's argmax the drawn token.
    again = SeededSampler([123], samples_per_seed=n, temperature=temperature, top_p=top_p)
    assert torch.equal(again(torch.zeros(n, 1), logits.expand(n, -1)).argmax(-1), tokens)


def _responses(out, rows: range) -> list[list[int]]:
    lengths = out.response_mask.sum(-1).long()
    return [out.input_ids[r, out.prompt_length : out.prompt_length + int(lengths[r])].tolist() for r in rows]


def test_a_prompts_samples_do_not_depend_on_its_batch():
    model, tokenizer = load_model_and_tokenizer("tiny-arith", seed=0)
    engine = HFGenerate(model, tokenizer)
    g = 4
    kwargs = dict(num_samples=g, temperature=1.0, top_p=0.95, max_new_tokens=8)
    alone = tokenizer(["12+3="], return_tensors="pt", padding=True)
    batch = tokenizer(["7+45=", "123+456=", "12+3="], return_tensors="pt", padding=True)
    assert batch["attention_mask"][2].sum() < batch["attention_mask"].shape[1]  # padded in the batch
    out_alone = engine.generate(alone["input_ids"], alone["attention_mask"], seeds=[77], **kwargs)  # type: ignore[arg-type]
    out_batch = engine.generate(batch["input_ids"], batch["attention_mask"], seeds=[5, 6, 77], **kwargs)  # type: ignore[arg-type]
    assert _responses(out_alone, range(g)) == _responses(out_batch, range(2 * g, 3 * g))
    assert len({tuple(r) for r in _responses(out_alone, range(g))}) > 1  # a group's samples differ
    other = engine.generate(alone["input_ids"], alone["attention_mask"], seeds=[78], **kwargs)  # type: ignore[arg-type]
    assert _responses(other, range(g)) != _responses(out_alone, range(g))
    # Without seeds, the prompts' seeds come from torch's global RNG: reproducible under manual_seed.
    torch.manual_seed(0)
    first = engine.generate(batch["input_ids"], batch["attention_mask"], **kwargs)  # type: ignore[arg-type]
    torch.manual_seed(0)
    second = engine.generate(batch["input_ids"], batch["attention_mask"], **kwargs)  # type: ignore[arg-type]
    assert torch.equal(first.input_ids, second.input_ids)


@pytest.fixture(scope="module")
def policy():
    spec = TrainSpec.model_validate(small_spec())
    model, tokenizer = placement.load_policy(spec, None)
    model.eval()
    return spec, model, tokenizer


def _samples_by_group(policy, rank: int, world: int, *, step: int, spec=None) -> dict[int, list[list[int]]]:
    """{global prompt index: its G responses' token ids} that this process samples at `step`."""
    base, model, tokenizer = policy
    spec = spec or base
    prompts, _ = load_examples(spec)
    prompts.cursor = 7
    # The global RNG is seeded per process differently on purpose: the samples must not read it.
    seed_everything(1000 + rank)
    batch, _ = collect(
        model, tokenizer, prompts, spec, rank=rank, world=world, sample_stats=False,
        reduce=lambda value, *_: torch.tensor(value), step=step, engine=HFGenerate(model, tokenizer),
    )  # fmt: skip
    lengths = batch.response_mask.sum(-1).long()
    out: dict[int, list[list[int]]] = {}
    for row, group in enumerate(batch.group_ids.tolist()):
        response = batch.input_ids[row, batch.prompt_length : batch.prompt_length + int(lengths[row])]
        out.setdefault(group, []).append(response.tolist())
    return out


def test_a_steps_samples_are_the_same_at_one_two_and_three_processes(policy):
    alone = _samples_by_group(policy, 0, 1, step=4)
    assert sorted(alone) == [7, 8, 9]
    for world in (2, 3):
        merged: dict[int, list[list[int]]] = {}
        for rank in range(world):
            merged.update(_samples_by_group(policy, rank, world, step=4))
        assert merged == alone, world
    assert _samples_by_group(policy, 0, 1, step=5) != alone  # another step, other streams


def test_evaluation_samples_are_the_same_at_any_process_count(tmp_path):
    k = 3
    spec = TrainSpec.model_validate(
        small_spec(task={"eval_size": 6}, evaluation={"interval": 0, "k": k, "greedy": False})
    )
    engine = Engine(spec, tmp_path / "eval", progress=False)
    seed_everything(spec.seed)
    engine.setup()
    real_generate = engine.rollout_engine.generate
    seen: dict[tuple[int, ...], list[list[int]]] = {}

    def recording(prompt_ids, prompt_mask, **kwargs):
        out = real_generate(prompt_ids, prompt_mask, **kwargs)
        for i, (ids, mask) in enumerate(zip(prompt_ids, prompt_mask)):
            seen[tuple(ids[mask.bool()].tolist())] = _responses(out, range(i * k, (i + 1) * k))
        return out

    engine.rollout_engine.generate = recording  # type: ignore[method-assign]

    def samples(step: int, world: int) -> dict[tuple[int, ...], list[list[int]]]:
        seen.clear()
        engine.step = step
        for rank in range(world):
            engine.rank, engine.world = rank, world  # this process's share, as process `rank` of `world`
            seed_everything(50 + rank)  # the samples must not read the global RNG
            assert engine.evaluate()["eval/num_prompts"] == len(range(rank, 6, world))
        return dict(seen)

    whole = samples(2, 1)
    assert len(whole) == 6
    assert samples(2, 2) == whole
    assert samples(2, 3) == whole
    assert samples(3, 1) != whole  # another step: other streams


def _threaded_collect(policy, spec, world: int, step: int) -> list[tuple]:
    """`collect` as `world` processes would run it, one thread each, with a summing reduce across the
    threads (a barrier, as the processes' all-reduce): per rank (batch, generation batches, cursor)."""
    _, model, tokenizer = policy
    barrier = threading.Barrier(world)
    slots: list[torch.Tensor | None] = [None] * world
    results: list[tuple | None] = [None] * world
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        def reduce(values, reduction, dtype):
            slots[rank] = torch.tensor(values, dtype=dtype)
            barrier.wait()
            stacked = torch.stack([s for s in slots if s is not None])
            out = stacked.sum(0) if reduction == "sum" else stacked.max(0).values
            barrier.wait()
            return out

        try:
            prompts, _ = load_examples(spec)
            prompts.cursor = 7
            own_model = copy.deepcopy(model)  # each "process" its own copy of the weights
            batch, batches = collect(
                own_model, tokenizer, prompts, spec, rank=rank, world=world, sample_stats=False,
                reduce=reduce, step=step, engine=HFGenerate(own_model, tokenizer),
            )  # fmt: skip
            results[rank] = (batch, batches, prompts.cursor)
        except BaseException as err:  # re-raised in the test's thread
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


def _by_group(batch) -> dict[int, list[list[int]]]:
    lengths = batch.response_mask.sum(-1).long()
    out: dict[int, list[list[int]]] = {}
    for row, group in enumerate(batch.group_ids.tolist()):
        response = batch.input_ids[row, batch.prompt_length : batch.prompt_length + int(lengths[row])]
        out.setdefault(group, []).append(response.tolist())
    return out


def test_dynamic_sampling_keeps_the_same_groups_at_any_process_count(policy):
    spec = TrainSpec.model_validate(
        small_spec(
            algorithm={"name": "grpo_ds"},
            optim={"prompts_per_step": 3, "dynamic_sampling": {"enabled": True, "max_gen_batches": 4}},
        )
    )
    ((alone, batches, cursor),) = _threaded_collect(policy, spec, 1, DS_STEP)
    kept = _by_group(alone)
    # The step needed more than one round, and kept exactly prompts_per_step groups.
    assert batches > 1 and len(kept) == 3
    for world in (2, 3):
        shares = _threaded_collect(policy, spec, world, DS_STEP)
        assert {(b, c) for _, b, c in shares} == {(batches, cursor)}  # the same rounds, the same cursor
        merged: dict[int, list[list[int]]] = {}
        for batch, _, _ in shares:
            merged.update(_by_group(batch))
        assert merged == kept, world
