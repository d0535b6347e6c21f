"""Multi-turn rollouts: episodes of a tool-use environment (trainer/envs/tool_use.py), sampled turn by turn
through a rollout engine, and laid out as token rows for training (docs/TOOLS.md). Each model turn's context
goes in as the ids the model produced plus the tools' ids (token-in, token-out); `trainer.rollout.batch`
scores the episodes' answers and makes them a `Rollout`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from contract.spec import TrainSpec
from trainer.envs.tool_use import ToolUseEnv, episode_counts
from trainer.rollout.generation import RolloutEngine
from trainer.rollout.sampling import seeds_or_drawn, turn_seeds
from trainer.tasks.sources import Example, render_prompt


@torch.no_grad()
def generate_turn(
    model: Any,
    tokenizer: Any,
    contexts: list[list[int]],
    *,
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    greedy: bool = False,
    engine: RolloutEngine,
    seeds: Sequence[int] | None = None,
) -> tuple[list[list[int]], list[bool], list[list[float]] | None]:
    """One model turn for each context (token ids, unpadded): the sampled ids up to and including the first
    EOS, whether the turn hit max_new_tokens without EOS, and each sampled id's log-prob under the engine's
    sampler where the engine records one (vLLM; None for HF generate, whose sampler is the trainer). The
    contexts go in as ids, left-padded, never as text: the model sees exactly these tokens (token-in,
    token-out). `engine`: the rollout engine to sample with. `seeds`: each context's sampling stream (None:
    drawn from torch's global RNG)."""
    width = max(len(c) for c in contexts)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(contexts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for row, context in enumerate(contexts):
        ids[row, width - len(context) :] = torch.tensor(context, dtype=torch.long)
        mask[row, width - len(context) :] = 1
    out = engine.generate(
        ids, mask, num_samples=1, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
        greedy=greedy, seeds=seeds,
    )  # fmt: skip
    lengths = out.response_mask.sum(-1).long().tolist()
    turns = out.input_ids[:, out.prompt_length :].tolist()
    logprobs = None
    if out.sampler_logprob is not None:
        logprobs = [row[:n] for row, n in zip(out.sampler_logprob.tolist(), lengths)]
    return [row[:n] for row, n in zip(turns, lengths)], out.truncated.tolist(), logprobs


@dataclass
class Episodes:
    """Multi-turn episodes: per row the prompt's ids and the pieces after it, (ids, is a model turn)."""

    prompt_ids: list[list[int]]
    pieces: list[list[tuple[list[int], bool]]]
    answers: list[str]  # the last model turn's text: what the verifier scores
    truncated: list[bool]  # the last model turn hit max_new_tokens without EOS
    seen: list[list[tuple[list[int], list[int]]]]  # per row and turn: (context given, ids sampled)
    envs: list[Any]
    # Per row and model turn: each sampled id's log-prob under the engine's sampler (vLLM), in the order of
    # the model pieces; None when some turn's engine recorded none (HF generate).
    sampler_logprobs: list[list[list[float]]] | None = None


def run_episodes(
    model: Any,
    tokenizer: Any,
    examples: list[Example],
    spec: TrainSpec,
    *,
    num_samples: int,
    temperature: float,
    top_p: float,
    greedy: bool = False,
    engine: RolloutEngine,
    seeds: Sequence[int] | None = None,
) -> Episodes:
    """num_samples episodes of spec.environment per example (rows example-major, like `generate`). Each turn
    runs generate over the rows still going; tool results are tokenised on their own and appended to the
    ids, so the context is always the ids the model produced plus the tools' ids. `seeds`: each example's
    stream (None: drawn from torch's global RNG); a row's turn t samples from (its example's stream, its
    sample index, t), so an episode is the same whatever else is in the batch."""
    env_spec = spec.environment
    assert env_spec is not None
    rows = [ex for ex in examples for _ in range(num_samples)]
    envs = [ToolUseEnv(env_spec) for _ in rows]
    episodes = Episodes(
        prompt_ids=_reset_prompt_ids(rows, envs, spec, tokenizer),
        pieces=[[] for _ in rows],
        answers=["" for _ in rows],
        truncated=[False for _ in rows],
        seen=[[] for _ in rows],
        envs=envs,
        sampler_logprobs=[[] for _ in rows],
    )
    active = list(range(len(rows)))
    example_seeds = [0] * len(examples) if greedy else seeds_or_drawn(seeds, len(examples))
    turn_index = 0
    while active:
        contexts = [
            episodes.prompt_ids[i] + [t for ids, _ in episodes.pieces[i] for t in ids] for i in active
        ]
        row_seeds = turn_seeds(example_seeds, num_samples, turn_index)
        turn_index += 1
        turns, cut, turn_logprobs = generate_turn(
            model,
            tokenizer,
            contexts,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=spec.sampling.max_new_tokens,
            greedy=greedy,
            engine=engine,
            seeds=[row_seeds[i] for i in active],
        )
        _record_sampler_logprobs(episodes, active, turn_logprobs)
        active = _step_environments(
            episodes, active, contexts, turns, cut, tokenizer, env_spec.max_result_tokens
        )
    return episodes


def _reset_prompt_ids(
    rows: list[Example], envs: list[ToolUseEnv], spec: TrainSpec, tokenizer: Any
) -> list[list[int]]:
    """Each row's prompt ids: its environment reset on its example, rendered with the task's template."""
    prompts = [
        render_prompt(
            dataclasses.replace(ex, prompt=env.reset(ex)),
            spec.task.prompt_template,
            tokenizer,
            use_chat_template=spec.task.use_chat_template,
        )
        for ex, env in zip(rows, envs)
    ]
    add_special = not spec.task.use_chat_template
    return [list(ids) for ids in tokenizer(prompts, add_special_tokens=add_special)["input_ids"]]


def _record_sampler_logprobs(
    episodes: Episodes, active: list[int], turn_logprobs: list[list[float]] | None
) -> None:
    """Appends one turn's sampler log-probs to the active rows; none at all once a turn's engine recorded
    none (HF generate)."""
    if episodes.sampler_logprobs is not None and turn_logprobs is not None:
        for i, values in zip(active, turn_logprobs):
            episodes.sampler_logprobs[i].append(values)
    else:
        episodes.sampler_logprobs = None


def _step_environments(
    episodes: Episodes,
    active: list[int],
    contexts: list[list[int]],
    turns: list[list[int]],
    cut: list[bool],
    tokenizer: Any,
    max_result_tokens: int,
) -> list[int]:
    """Hands each active row's turn to its environment: a finished episode keeps the turn's text as its
    answer; a tool call's result, tokenised on its own and cut to max_result_tokens, is appended after
    the turn. Returns the rows still going."""
    still = []
    for i, context, turn, hit_budget in zip(active, contexts, turns, cut):
        episodes.seen[i].append((context, turn))
        episodes.pieces[i].append((turn, True))
        text = str(tokenizer.decode(turn, skip_special_tokens=True))
        outcome = episodes.envs[i].step(text)
        if outcome.done:
            episodes.answers[i], episodes.truncated[i] = text, bool(hit_budget)
            continue
        assert outcome.observation is not None
        result_ids = list(tokenizer(outcome.observation, add_special_tokens=False)["input_ids"])
        episodes.pieces[i].append((result_ids[:max_result_tokens], False))
        still.append(i)
    return still


def episodes_to_rollout(episodes: Episodes, pad_token_id: int) -> tuple[Tensor, Tensor, Tensor, int, Tensor]:
    """(input_ids (B, P+R), attention_mask, response_mask (B, R), P, tool_counts (B, C)): prompts
    left-padded, the pieces after them right-padded; response_mask 1 on model tokens only. The counters'
    token_mismatches compares each turn's context and sampled ids with the laid-out row."""
    n = len(episodes.prompt_ids)
    p_len = max(len(p) for p in episodes.prompt_ids)
    responses = [[t for ids, _ in row for t in ids] for row in episodes.pieces]
    r_len = max(1, max(len(r) for r in responses))
    input_ids = torch.full((n, p_len + r_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, p_len + r_len), dtype=torch.long)
    response_mask = torch.zeros((n, r_len), dtype=torch.float32)
    counts = []
    for i, (prompt, row) in enumerate(zip(episodes.prompt_ids, episodes.pieces)):
        start = p_len - len(prompt)
        input_ids[i, start:p_len] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[i, start:p_len] = 1
        pos = 0
        tool_tokens = model_tokens = 0
        for ids, is_model in row:
            if ids:
                input_ids[i, p_len + pos : p_len + pos + len(ids)] = torch.tensor(ids, dtype=torch.long)
                attention_mask[i, p_len + pos : p_len + pos + len(ids)] = 1
                response_mask[i, pos : pos + len(ids)] = 1.0 if is_model else 0.0
            pos += len(ids)
            if is_model:
                model_tokens += len(ids)
            else:
                tool_tokens += len(ids)
        laid_out = input_ids[i][attention_mask[i].bool()].tolist()
        mismatches = 0
        for context, turn in episodes.seen[i]:
            expected = context + turn
            actual = laid_out[: len(expected)]
            mismatches += sum(a != b for a, b in zip(expected, actual)) + len(expected) - len(actual)
        counts.append(episode_counts(episodes.envs[i], tool_tokens, model_tokens, mismatches))
    return input_ids, attention_mask, response_mask, p_len, torch.tensor(counts, dtype=torch.float32)


def episodes_sampler_logprob(episodes: Episodes, width: int) -> Tensor | None:
    """(B, width) each response token's sampler log-prob, laid out as `episodes_to_rollout` lays out the
    pieces: the model turns' values at their tokens, 0 on the tool results (not sampled: response_mask 0
    there, so the mismatch metrics and the correction leave them out) and past the episode. None when the
    episodes carry none (HF generate)."""
    if episodes.sampler_logprobs is None:
        return None
    out = torch.zeros((len(episodes.pieces), width), dtype=torch.float32)
    for i, (row, turn_values) in enumerate(zip(episodes.pieces, episodes.sampler_logprobs)):
        values = iter(turn_values)
        pos = 0
        for ids, is_model in row:
            if is_model:
                turn = next(values)
                if len(turn) != len(ids):
                    raise ValueError(f"episode {i}: {len(turn)} sampler log-probs, {len(ids)} turn tokens")
                out[i, pos : pos + len(ids)] = torch.tensor(turn, dtype=torch.float32)
            pos += len(ids)
    return out
