"""Held-out evaluation: k samples (or one greedy answer) per evaluation example, scored by the verifier;
avg@k, pass@k and the response length, summed over the processes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from contract.samples import SAMPLES_PER_EVAL
from contract.spec import TrainSpec
from trainer.distributed.runtime import Reduce
from trainer.graders.job import JobGrading
from trainer.rollout.batch import run_episodes
from trainer.rollout.generation import RolloutEngine
from trainer.samples import eval_samples
from trainer.tasks.sources import Example, render_prompt
from trainer.tasks.verifiers import score

CHUNK_PROMPTS = 128


@torch.no_grad()
def evaluate(
    model: Any,
    tokenizer: Any,
    spec: TrainSpec,
    examples: list[Example],
    reduce: Reduce,
    *,
    engine: RolloutEngine,
    seeds: Sequence[int] | None = None,
    grading: JobGrading | None = None,
    samples: list[dict[str, Any]] | None = None,
) -> dict[str, float]:
    """The eval/ metrics over `examples` (this process's share), scored by the verifier or the job's
    grader (`grading`: a sample passes when its score reaches the pass threshold); `reduce` sums host numbers over the
    processes; `engine`: the rollout engine; `seeds`: each example's sampling stream (trainer.rollout.sampling:
    (job seed, "eval", step, its index in the evaluation set); None: drawn from torch's global RNG);
    `samples`: where given, filled with the first examples' completions (trainer.samples). The model is
    left in train mode."""
    ev = spec.evaluation
    model.eval()
    k = 1 if ev.greedy else ev.k
    correct_sum, pass_sum, length_sum, n_prompts = 0.0, 0.0, 0.0, 0
    for s in range(0, len(examples), CHUNK_PROMPTS):
        chunk = examples[s : s + CHUNK_PROMPTS]
        chunk_seeds = seeds[s : s + CHUNK_PROMPTS] if seeds is not None else None
        if spec.environment is not None:
            chunk_correct, chunk_pass, chunk_length = eval_episodes(
                model, tokenizer, spec, chunk, k, engine, chunk_seeds, grading
            )
            correct_sum, pass_sum = correct_sum + chunk_correct, pass_sum + chunk_pass
            length_sum, n_prompts = length_sum + chunk_length, n_prompts + len(chunk)
            continue
        for mean_score, passed, lengths in eval_responses(
            model, tokenizer, spec, chunk, k, engine, chunk_seeds, grading, samples
        ):
            for n in lengths:  # summed in this order, sample by sample, as the totals always were
                length_sum += n
            correct_sum += mean_score
            pass_sum += passed
            n_prompts += 1
    totals = reduce([correct_sum, pass_sum, length_sum, float(n_prompts)], "sum", torch.float64)
    n_total = max(float(totals[3]), 1.0)
    model.train()
    return {
        "eval/avg@k": float(totals[0]) / n_total,
        "eval/pass@k": float(totals[1]) / n_total,
        "eval/k": float(k),
        "eval/response_length": float(totals[2]) / (n_total * k),
        "eval/num_prompts": float(totals[3]),
    }


def eval_responses(
    model: Any,
    tokenizer: Any,
    spec: TrainSpec,
    chunk: list[Example],
    k: int,
    engine: RolloutEngine,
    seeds: Sequence[int] | None = None,
    grading: JobGrading | None = None,
    samples: list[dict[str, Any]] | None = None,
) -> list[tuple[float, float, list[float]]]:
    """k single-turn responses per example: per example (mean score, 1.0 if a sample scores 1, the
    samples' response lengths); `samples`: where given, topped up to SAMPLES_PER_EVAL (trainer.samples)."""
    ev = spec.evaluation
    prompts = [
        render_prompt(e, spec.task.prompt_template, tokenizer, use_chat_template=spec.task.use_chat_template)
        for e in chunk
    ]
    enc = tokenizer(
        prompts, return_tensors="pt", padding=True, add_special_tokens=not spec.task.use_chat_template
    )
    generated = engine.generate(
        enc["input_ids"], enc["attention_mask"], num_samples=k, temperature=ev.temperature, top_p=ev.top_p,
        max_new_tokens=spec.sampling.max_new_tokens, greedy=ev.greedy, seeds=seeds,
    )  # fmt: skip
    ids, resp_mask, p_len = generated.input_ids, generated.response_mask, generated.prompt_length
    lengths = [float(resp_mask[row].sum()) for row in range(len(chunk) * k)]
    texts = [
        str(tokenizer.decode(ids[row, p_len : p_len + int(n)], skip_special_tokens=True))
        for row, n in enumerate(lengths)
    ]
    scores = _scores(spec, texts, [chunk[row // k] for row in range(len(texts))], grading)
    if samples is not None:
        room = SAMPLES_PER_EVAL - len(samples)
        samples += eval_samples(chunk, texts, scores, generated.truncated.tolist(), k, room)
    out = []
    for j in range(len(chunk)):
        mine = scores[j * k : (j + 1) * k]
        out.append((sum(mine) / k, float(max(mine) >= 1.0), lengths[j * k : (j + 1) * k]))
    return out


def _scores(
    spec: TrainSpec, texts: list[str], examples: list[Example], grading: JobGrading | None
) -> list[float]:
    """Each sample's score: the verifier's, or its pass (0 or 1) under the job's grader."""
    if grading is not None:
        return grading.eval_passes(texts, examples)
    return [score(spec.verifier.name, text, ex, spec.verifier.params) for text, ex in zip(texts, examples)]


def eval_episodes(
    model: Any,
    tokenizer: Any,
    spec: TrainSpec,
    chunk: list[Example],
    k: int,
    engine: RolloutEngine,
    seeds: Sequence[int] | None = None,
    grading: JobGrading | None = None,
) -> tuple[float, float, float]:
    """k tool-use episodes per example, scored on their answers: (sum over the examples of the mean
    score, examples with a sample scoring 1, model tokens of every episode)."""
    ev = spec.evaluation
    episodes = run_episodes(
        model, tokenizer, chunk, spec, num_samples=k, temperature=ev.temperature, top_p=ev.top_p,
        greedy=ev.greedy, engine=engine, seeds=seeds,
    )  # fmt: skip
    model_tokens = sum(len(ids) for row in episodes.pieces for ids, is_model in row if is_model)
    scores = _scores(
        spec, episodes.answers, [chunk[row // k] for row in range(len(episodes.answers))], grading
    )
    per_example = [scores[j * k : (j + 1) * k] for j in range(len(chunk))]
    return (
        sum(sum(s) / k for s in per_example),
        sum(float(max(s) >= 1.0) for s in per_example),
        float(model_tokens),
    )
