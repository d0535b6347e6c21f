"""The training prompts in their seeded order (read through a checkpointed cursor), the evaluation set, and
each step's rollouts from them (`collect`, with dynamic sampling)."""

from __future__ import annotations

from typing import Any

import torch

from contract import algorithms
from contract.spec import TrainSpec
from trainer.algos import informative_groups
from trainer.distributed.runtime import Reduce
from trainer.graders.job import JobGrading
from trainer.rollout.batch import Rollout, concat_rollouts, rollout
from trainer.rollout.generation import RolloutEngine
from trainer.rollout.sampling import SampleStreams
from trainer.tasks.sources import Example, make_train_eval


class PromptOrder:
    """The training prompts in a seeded order, a fresh permutation per epoch, read through a cursor (saved
    in checkpoints, so a resumed run takes the prompts the uninterrupted one would have)."""

    def __init__(self, examples: list[Example], seed: int, cursor: int = 0) -> None:
        if not examples:
            raise ValueError("task: no training examples")
        self.examples, self.seed, self.cursor = examples, seed, cursor
        self._order: tuple[int, list[int]] | None = None

    def take(self, n: int) -> tuple[list[Example], int]:
        """The next n prompts; returns them and the first one's global index."""
        start = self.cursor
        size = len(self.examples)
        out = []
        for pos in range(start, start + n):
            epoch, offset = divmod(pos, size)
            out.append(self.examples[self._epoch_order(epoch)[offset]])
        self.cursor += n
        return out, start

    def example_at(self, position: int) -> Example:
        """The example at a global position of the order (a rollout's group id)."""
        epoch, offset = divmod(position, len(self.examples))
        return self.examples[self._epoch_order(epoch)[offset]]

    def _epoch_order(self, epoch: int) -> list[int]:
        """The seeded permutation of the examples for `epoch`, drawn once per epoch."""
        if self._order is None or self._order[0] != epoch:
            g = torch.Generator().manual_seed(self.seed * 7_777 + epoch)
            self._order = (epoch, torch.randperm(len(self.examples), generator=g).tolist())
        return self._order[1]


def load_examples(spec: TrainSpec) -> tuple[PromptOrder, list[Example]]:
    """The task's training prompts, in their seeded order, and its evaluation examples."""
    t = spec.task
    train, evaluation = make_train_eval(
        t.source,
        name=t.name,
        path=t.path,
        size=t.train_size,
        eval_size=t.eval_size,
        seed=spec.seed,
        params=t.params,
    )
    return PromptOrder(train, spec.seed), evaluation


def collect(
    model: Any,
    tokenizer: Any,
    prompts: PromptOrder,
    spec: TrainSpec,
    *,
    rank: int,
    world: int,
    sample_stats: bool,
    reduce: Reduce,
    step: int,
    engine: RolloutEngine,
    grading: JobGrading | None = None,
) -> tuple[Rollout, int]:
    """This process's rollouts for step `step` (the model in eval mode): the next prompts_per_step prompts,
    this process's share of them; with dynamic sampling, batches are generated until enough informative
    groups (summed over the processes by `reduce`) or max_gen_batches, and the step trains on the first
    prompts_per_step informative groups over every process (`first_informative`). Returns (rollout, gen
    batches). Each prompt samples from its own stream (trainer.rollout.sampling): (job seed, "train", step,
    generation round, its index in the round's prompts_per_step). So a step's batch, summed over the
    processes, is the same at any number of processes."""
    n_prompts = spec.optim.prompts_per_step
    ds = spec.optim.dynamic_sampling
    # Rewards are binary unless shaped (an overlong penalty, set or the algorithm's default).
    binary = spec.reward.overlong is None and not algorithms.get(spec.algorithm.name).overlong_shaping
    kept: list[Rollout] = []
    kept_groups = 0
    batches = 0
    start = prompts.cursor
    while True:
        examples, first = prompts.take(n_prompts)
        mine = list(range(rank, n_prompts, world))
        group_ids = [first + i for i in mine]  # each group's global prompt index
        streams = SampleStreams(spec.seed, "train", step, round=batches)
        r = rollout(
            model,
            tokenizer,
            [examples[i] for i in mine],
            group_ids,
            spec,
            sample_stats=sample_stats,
            engine=engine,
            seeds=streams.prompt_seeds(mine),
            grading=grading,
        )
        batches += 1
        if ds.enabled:
            r = r.select(torch.nonzero(informative_groups(r.rewards, r.group_ids, binary=binary)).flatten())
        kept.append(r)
        kept_groups += int(torch.unique(r.group_ids).numel()) if r.size else 0
        if not ds.enabled:
            break
        total = int(reduce(kept_groups, "sum", torch.int64))
        if total >= n_prompts or batches >= ds.max_gen_batches:
            break
    non_empty = [k for k in kept if k.size] or [kept[-1]]
    batch = concat_rollouts(non_empty, tokenizer.pad_token_id)
    if ds.enabled:
        batch = first_informative(batch, start, batches * n_prompts, n_prompts, reduce)
    return batch, batches


def first_informative(batch: Rollout, start: int, drawn: int, n_prompts: int, reduce: Reduce) -> Rollout:
    """This process's rows of the step's first `n_prompts` informative groups over every process, in the
    order the prompts were drawn (group id = start + round · prompts_per_step + index; `drawn` prompts in
    all): what one process would keep. One sum-reduce of a 0/1 mask over the drawn prompts. The processes'
    shares are uneven (up to all of them on one process); the update pads the others' micro-batches."""
    mask = [0.0] * drawn
    for group in torch.unique(batch.group_ids).tolist():
        mask[int(group) - start] = 1.0
    informative = torch.nonzero(reduce(mask, "sum", torch.float64) > 0).flatten()[:n_prompts]
    last = start + int(informative[-1]) if informative.numel() else start - 1
    return batch.select(torch.nonzero(batch.group_ids <= last).flatten())
