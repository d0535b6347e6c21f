"""The samples a run keeps (contract.samples): the first held-out examples of every evaluation with their
first completion, and a few responses of a training step at an interval, written as `samples` events."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from contract.protocol import EventType
from contract.samples import SAMPLES_PER_EVAL, TRAIN_SAMPLES, Phase, sample, train_sample_step
from trainer.rollout.batch import Rollout
from trainer.tasks.sources import Example

Emit = Callable[[dict[str, Any]], None]


def eval_samples(
    examples: Sequence[Example],
    texts: Sequence[str],
    scores: Sequence[float],
    truncated: Sequence[bool],
    k: int,
    room: int = SAMPLES_PER_EVAL,
) -> list[dict[str, Any]]:
    """The first `room` examples' first completion (of their k: rows j·k), scored, and whether it was cut
    at max_new_tokens (no EOS within the budget)."""
    return [
        sample(examples[j].prompt, texts[j * k], examples[j].answer, scores[j * k], bool(truncated[j * k]))
        for j in range(min(room, len(examples)))
    ]


def train_samples(batch: Rollout, example_at: Callable[[int], Example]) -> list[dict[str, Any]]:
    """The first response of each of the batch's first TRAIN_SAMPLES groups (this process's rows), with its
    prompt and reference (`example_at`: the example of a global prompt index) and its reward."""
    out: list[dict[str, Any]] = []
    seen: set[int] = set()
    for row, group in enumerate(batch.group_ids.tolist()):
        if group in seen or row >= len(batch.texts):
            continue
        seen.add(group)
        example = example_at(int(group))
        reward, truncated = float(batch.rewards[row]), bool(batch.truncated[row])
        out.append(sample(example.prompt, batch.texts[row], example.answer, reward, truncated))
        if len(out) == TRAIN_SAMPLES:
            break
    return out


def emit_samples(emit: Emit, step: int, phase: Phase, samples: list[dict[str, Any]]) -> None:
    """The `samples` event, where there are samples."""
    if samples:
        emit({"type": EventType.SAMPLES, "step": step, "phase": phase, "samples": samples})


def emit_train_samples(
    emit: Emit, step: int, batch: Rollout | None, example_at: Callable[[int], Example]
) -> None:
    """A training step's samples, on the steps that keep them (contract.samples.train_sample_step)."""
    if batch is not None and train_sample_step(step):
        emit_samples(emit, step, "train", train_samples(batch, example_at))
