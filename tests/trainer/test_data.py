"""A step's prompts do not depend on the number of processes (trainer.data).

Every process reads the same seeded prompt order through the same cursor, takes the step's
prompts_per_step prompts, and keeps its share (every world-th from its rank), with each group's id its
global prompt index. So the prompts of a step at 1 process are those of the same step at 2 or 3, split
without overlap: checked on the real rollouts of the tiny model, at the start, mid-epoch and across the
epoch boundary (a new permutation), by group id and by the prompt text each group was generated from.
What does differ is the sampling noise: every process reseeds the same step seed, so at 2 processes a
prompt's responses come from another part of the RNG stream than at 1 (and another padding): the
responses, and so the rewards and the update, are not comparable one to one.
"""

from __future__ import annotations

import pytest
import torch

from contract.spec import TrainSpec
from tests.trainer.test_engine import small_spec
from trainer.data import collect, load_examples
from trainer.engine import seed_everything, step_seed
from trainer.policy import placement
from trainer.rollout.generation import HFGenerate


@pytest.fixture(scope="module")
def policy():
    spec = TrainSpec.model_validate(small_spec())
    model, tokenizer = placement.load_policy(spec, None)
    model.eval()
    return spec, model, tokenizer


def _prompts_by_group(policy, cursor: int, rank: int, world: int) -> dict[int, str]:
    """{global prompt index: prompt text} of the groups this process generates for the step at `cursor`."""
    spec, model, tokenizer = policy
    prompts, _ = load_examples(spec)
    prompts.cursor = cursor
    seed_everything(step_seed(spec.seed, 1))
    batch, _ = collect(
        model, tokenizer, prompts, spec, rank=rank, world=world, sample_stats=False,
        reduce=lambda value, *_: torch.tensor(value), step=1, engine=HFGenerate(model, tokenizer),
    )  # fmt: skip
    assert prompts.cursor == cursor + spec.optim.prompts_per_step  # every process moves the cursor alike
    rows = batch.input_ids[:, : batch.prompt_length]
    texts = tokenizer.batch_decode(rows, skip_special_tokens=True)
    out: dict[int, str] = {}
    for group, text in zip(batch.group_ids.tolist(), texts, strict=True):
        assert out.setdefault(group, text) == text  # one prompt per group
    return out


@pytest.mark.parametrize("cursor", [0, 30, 63], ids=["start", "mid-epoch", "epoch-boundary"])
def test_a_steps_prompts_are_the_same_at_one_two_and_three_processes(policy, cursor):
    alone = _prompts_by_group(policy, cursor, 0, 1)
    assert sorted(alone) == list(range(cursor, cursor + 3))
    assert len(set(alone.values())) > 1  # the prompts differ, so the comparison below can fail
    for world in (2, 3):
        shares = [_prompts_by_group(policy, cursor, rank, world) for rank in range(world)]
        assert sum(len(share) for share in shares) == len(alone), world  # no prompt twice
        merged = {group: text for share in shares for group, text in share.items()}
        assert merged == alone, world
    assert sorted(_prompts_by_group(policy, cursor, 1, 2)) == [cursor + 1]  # rank 1's share: every 2nd
