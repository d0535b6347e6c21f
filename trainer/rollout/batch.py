"""Rollouts: sample G responses per prompt through a rollout engine (trainer.rollout.generation: HF generate by
default), score them, and lay them out for training.

Layout of a batch of B responses: `input_ids` (B, P + R) = left-padded prompt (P) followed by the
response (R, right-padded after EOS). `response_mask` (B, R) is 1 on generated tokens up to and including
the first EOS. Position ids are derived from the attention mask, the way generate derives them, so the
training forward scores exactly the tokens generate sampled.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from contract import algorithms
from contract.spec import TrainSpec
from trainer.algos.shaping import overlong_penalty
from trainer.graders.job import JobGrading
from trainer.rollout.episodes import Episodes, episodes_sampler_logprob, episodes_to_rollout, run_episodes
from trainer.rollout.generation import (
    Generation,
    HFGenerate,
    RolloutEngine,
    SampledTokenStats,
    position_ids_from_mask,
)
from trainer.tasks.sources import Example, render_prompt
from trainer.tasks.verifiers import score, shape_reward

REFLECTION_PATTERN = re.compile(
    r"\b(wait|however|let me check|let me verify|alternatively|double-check)\b", re.I
)


@dataclass
class Rollout:
    input_ids: Tensor  # (B, P + R) long
    attention_mask: Tensor  # (B, P + R) long
    response_mask: Tensor  # (B, R) float
    prompt_length: int  # P
    rewards: Tensor  # (B,) float
    correct: Tensor  # (B,) float in [0, 1]
    group_ids: Tensor  # (B,) long, global prompt index
    truncated: Tensor  # (B,) bool: no EOS within the budget
    texts: list[str] = field(default_factory=list)
    # Per response token under the sampling policy (B, R), 0 past the response; None when not recorded.
    sample_logprob: Tensor | None = None
    sample_entropy: Tensor | None = None
    sample_correction: Tensor | None = None
    # Tool-use environments: per-episode counters (B, len(trainer.envs.tool_use.COUNT_FIELDS)); None for
    # single-turn rollouts. Tool-result tokens sit inside the response with response_mask 0.
    tool_counts: Tensor | None = None
    # Per response token (B, R): its log-prob under a rollout engine that is not the trainer (vLLM's
    # sampler), for the mismatch metrics and the truncated IS correction (trainer.rollout.mismatch); else None.
    sampler_logprob: Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_lengths(self) -> Tensor:
        return self.response_mask.sum(-1)

    @property
    def has_sample_stats(self) -> bool:
        return self.sample_logprob is not None

    def position_ids(self) -> Tensor:
        return position_ids_from_mask(self.attention_mask)

    def _map_tensors(self, fn: Any) -> dict[str, Any]:
        return {
            f.name: fn(value) if isinstance(value, Tensor) else value
            for f in dataclasses.fields(self)
            if not isinstance(value := getattr(self, f.name), (int, list))
        }

    def to(self, device: torch.device | str) -> Rollout:
        """The same rollout with its tensors on `device` (the texts stay)."""
        return dataclasses.replace(self, **self._map_tensors(lambda t: t.to(device)))

    def select(self, index: Tensor) -> Rollout:
        return dataclasses.replace(
            self, **self._map_tensors(lambda t: t[index]), texts=[self.texts[i] for i in index.tolist()]
        )


def concat_rollouts(parts: list[Rollout], pad_token_id: int) -> Rollout:
    """Joins rollouts whose prompt/response widths differ by re-padding prompts left and responses right."""
    if len(parts) == 1:
        return parts[0]
    p_max = max(r.prompt_length for r in parts)
    r_max = max(r.response_mask.shape[1] for r in parts)
    ids, attn, resp = [], [], []
    with_stats = all(r.has_sample_stats for r in parts)
    stats: dict[str, list[Tensor]] = {name: [] for name in SAMPLE_STAT_FIELDS}
    for r in parts:
        p_pad, r_pad = p_max - r.prompt_length, r_max - r.response_mask.shape[1]
        ids.append(torch.nn.functional.pad(r.input_ids, (p_pad, r_pad), value=pad_token_id))
        attn.append(torch.nn.functional.pad(r.attention_mask, (p_pad, r_pad), value=0))
        resp.append(torch.nn.functional.pad(r.response_mask, (0, r_pad), value=0.0))
        for name in SAMPLE_STAT_FIELDS if with_stats else ():
            stats[name].append(torch.nn.functional.pad(getattr(r, name), (0, r_pad), value=0.0))
    return Rollout(
        input_ids=torch.cat(ids),
        attention_mask=torch.cat(attn),
        response_mask=torch.cat(resp),
        prompt_length=p_max,
        rewards=torch.cat([r.rewards for r in parts]),
        correct=torch.cat([r.correct for r in parts]),
        group_ids=torch.cat([r.group_ids for r in parts]),
        truncated=torch.cat([r.truncated for r in parts]),
        texts=[t for r in parts for t in r.texts],
        tool_counts=(
            torch.cat([r.tool_counts for r in parts if r.tool_counts is not None])
            if all(r.tool_counts is not None for r in parts)
            else None
        ),
        sampler_logprob=(
            torch.cat(
                [
                    torch.nn.functional.pad(r.sampler_logprob, (0, r_max - r.sampler_logprob.shape[1]))
                    for r in parts
                    if r.sampler_logprob is not None
                ]
            )
            if all(r.sampler_logprob is not None for r in parts)
            else None
        ),
        **{name: torch.cat(values) for name, values in stats.items() if with_stats},
    )


SAMPLE_STAT_FIELDS = ("sample_logprob", "sample_entropy", "sample_correction")


def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    num_samples: int,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    greedy: bool = False,
    add_special_tokens: bool = True,
    recorder: SampledTokenStats | None = None,
    seeds: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """(input_ids (B, P+R), attention_mask, response_mask (B, R), truncated (B,), P); B = prompts × samples,
    with HF generate on `model` (`HFGenerate.sample`). What it returns is on the CPU (texts are decoded and
    scored there). `recorder` (optional) watches generate's forward passes; read it with `recorder.finish`.
    """
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens)
    return HFGenerate(model, tokenizer).sample(
        enc["input_ids"], enc["attention_mask"], num_samples=num_samples, temperature=temperature,
        top_p=top_p, max_new_tokens=max_new_tokens, greedy=greedy, recorder=recorder, seeds=seeds,
    )  # fmt: skip


def rollout(
    model: Any,
    tokenizer: Any,
    examples: list[Example],
    group_offset: int | list[int],
    spec: TrainSpec,
    *,
    sample_stats: bool = False,
    engine: RolloutEngine,
    seeds: Sequence[int] | None = None,
    grading: JobGrading | None = None,
) -> Rollout:
    """Samples spec.sampling.group_size responses per example and scores them (with the job's grader when
    it has one: `grading`). `sample_stats`: also record
    each token's log-prob, entropy and C(p) under the sampling policy (`SampledTokenStats`; not for
    multi-turn rollouts, whose update scores its tokens itself). With spec.environment, each response is
    an episode of the environment (`env_rollout`). `group_offset`: each example's group id (its global
    prompt index), or the first of consecutive ones. `engine`: the rollout engine (trainer.rollout.generation).
    `seeds`: each example's sampling stream (trainer.rollout.sampling.SampleStreams; None: drawn from torch's global
    RNG)."""
    if spec.environment is not None:
        return env_rollout(
            model, tokenizer, examples, group_offset, spec, engine=engine, seeds=seeds, grading=grading
        )
    g = spec.sampling.group_size
    enc = encode_prompts(examples, spec, tokenizer)
    out = engine.generate(
        enc["input_ids"], enc["attention_mask"], num_samples=g, temperature=spec.sampling.temperature,
        top_p=spec.sampling.top_p, max_new_tokens=spec.sampling.max_new_tokens, record=sample_stats,
        seeds=seeds,
    )  # fmt: skip
    stats = out.sample_record
    texts = response_texts(out, tokenizer)
    correct, rewards = score_responses(texts, examples, out.response_mask, spec, grading)
    return Rollout(
        input_ids=out.input_ids,
        attention_mask=out.attention_mask,
        response_mask=out.response_mask,
        prompt_length=out.prompt_length,
        rewards=rewards,
        correct=correct,
        group_ids=group_id_rows(group_offset, len(examples), g),
        truncated=out.truncated,
        texts=texts,
        sampler_logprob=out.sampler_logprob,
        **(dict(zip(SAMPLE_STAT_FIELDS, stats)) if stats is not None else {}),
    )


def encode_prompts(examples: list[Example], spec: TrainSpec, tokenizer: Any) -> Any:
    """The examples' prompts, rendered with the task's template and tokenised as one left-padded batch
    (the tokenizer's `input_ids` and `attention_mask`, as tensors)."""
    prompts = [
        render_prompt(ex, spec.task.prompt_template, tokenizer, use_chat_template=spec.task.use_chat_template)
        for ex in examples
    ]
    return tokenizer(
        prompts, return_tensors="pt", padding=True, add_special_tokens=not spec.task.use_chat_template
    )


def response_texts(out: Generation, tokenizer: Any) -> list[str]:
    """Each sampled response decoded up to its last response token (special tokens skipped)."""
    responses = out.input_ids[:, out.prompt_length :]
    lengths = out.response_mask.sum(-1).long().tolist()
    texts: list[str] = tokenizer.batch_decode(
        [row[:n] for row, n in zip(responses.tolist(), lengths)], skip_special_tokens=True
    )
    return texts


def group_id_rows(group_offset: int | list[int], n_examples: int, group_size: int) -> Tensor:
    """(n_examples · G,) the group id of each row, example-major."""
    if isinstance(group_offset, int):
        return torch.arange(group_offset, group_offset + n_examples).repeat_interleave(group_size)
    if len(group_offset) != n_examples:
        raise ValueError(f"{len(group_offset)} group ids for {n_examples} examples")
    return torch.tensor(group_offset, dtype=torch.long).repeat_interleave(group_size)


def env_rollout(
    model: Any,
    tokenizer: Any,
    examples: list[Example],
    group_offset: int | list[int],
    spec: TrainSpec,
    *,
    engine: RolloutEngine,
    seeds: Sequence[int] | None = None,
    grading: JobGrading | None = None,
) -> Rollout:
    """spec.sampling.group_size episodes of spec.environment per example, scored on their answers;
    `seeds`: each example's sampling stream (`run_episodes`)."""
    g = spec.sampling.group_size
    episodes = run_episodes(
        model,
        tokenizer,
        examples,
        spec,
        num_samples=g,
        temperature=spec.sampling.temperature,
        top_p=spec.sampling.top_p,
        engine=engine,
        seeds=seeds,
    )
    return episodes_rollout(episodes, examples, group_offset, spec, tokenizer.pad_token_id, grading)


def episodes_rollout(
    episodes: Episodes,
    examples: list[Example],
    group_offset: int | list[int],
    spec: TrainSpec,
    pad_id: int,
    grading: JobGrading | None = None,
) -> Rollout:
    """The training batch of `run_episodes`' episodes (spec.sampling.group_size per example), scored on
    their answers; with the engine's sampler log-probs where the episodes carry them."""
    g = spec.sampling.group_size
    input_ids, attention_mask, response_mask, p_len, counts = episodes_to_rollout(episodes, pad_id)
    correct, rewards = score_responses(episodes.answers, examples, response_mask, spec, grading)
    return Rollout(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        prompt_length=p_len,
        rewards=rewards,
        correct=correct,
        group_ids=group_id_rows(group_offset, len(examples), g),
        truncated=torch.tensor(episodes.truncated, dtype=torch.bool),
        texts=episodes.answers,
        tool_counts=counts,
        sampler_logprob=episodes_sampler_logprob(episodes, response_mask.shape[1]),
    )


def score_responses(
    texts: list[str],
    examples: list[Example],
    response_mask: Tensor,
    spec: TrainSpec,
    grading: JobGrading | None = None,
) -> tuple[Tensor, Tensor]:
    """(verifier scores, shaped rewards) of responses laid out example-major, spec.sampling.group_size per
    example; the rewards carry DAPO's overlong penalty when it applies (on the response's model tokens).
    With a grader (`grading`): (passes, grader scores; trainer.graders.health for a failed grading)."""
    g = spec.sampling.group_size
    if grading is not None:
        scored, passes = grading.score(texts, [examples[i // g] for i in range(len(texts))], g)
        correct, rewards = (
            torch.tensor(passes, dtype=torch.float32),
            torch.tensor(scored, dtype=torch.float32),
        )
    else:
        scores = [
            score(spec.verifier.name, text, examples[i // g], spec.verifier.params)
            for i, text in enumerate(texts)
        ]
        correct = torch.tensor(scores, dtype=torch.float32)
        # From the float32 values, as before, so that a score that float32 rounds shapes the same way.
        rewards = torch.tensor(
            [shape_reward(c, spec.reward.style) for c in correct.tolist()], dtype=torch.float32
        )
    overlong = resolved_overlong(spec)
    if overlong is not None:
        rewards = rewards + overlong_penalty(
            response_mask.sum(-1), max_length=spec.sampling.max_new_tokens, cache_length=overlong
        )
    return correct, rewards


def resolved_overlong(spec: TrainSpec) -> int | None:
    """DAPO's overlong buffer length: the spec's, or a quarter of the budget for dapo by default."""
    if spec.reward.overlong is not None:
        return spec.reward.overlong.cache_length
    if algorithms.get(spec.algorithm.name).overlong_shaping:
        return max(1, spec.sampling.max_new_tokens // 4)
    return None


def reflection_rate(texts: list[str]) -> float:
    """Mean number of reflection phrases ("wait", "however", "let me check", ...) per response."""
    if not texts:
        return 0.0
    return sum(len(REFLECTION_PATTERN.findall(t)) for t in texts) / len(texts)
