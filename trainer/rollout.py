"""Rollouts: sample G responses per prompt with HF generate, score them, and lay them out for training.

Layout of a batch of B responses: `input_ids` (B, P + R) = left-padded prompt (P) followed by the
response (R, right-padded after EOS). `response_mask` (B, R) is 1 on generated tokens up to and including
the first EOS. Position ids are derived from the attention mask, the way generate derives them, so the
training forward scores exactly the tokens generate sampled.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache

from trainer.algos.shaping import overlong_penalty
from trainer.spec import TrainSpec
from trainer.tasks import Example, render_prompt
from trainer.verifiers import score, shape_reward

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

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_lengths(self) -> Tensor:
        return self.response_mask.sum(-1)

    def position_ids(self) -> Tensor:
        return position_ids_from_mask(self.attention_mask)

    def to(self, device: torch.device | str) -> Rollout:
        """The same rollout with its tensors on `device` (the texts stay)."""
        return dataclasses.replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            response_mask=self.response_mask.to(device),
            rewards=self.rewards.to(device),
            correct=self.correct.to(device),
            group_ids=self.group_ids.to(device),
            truncated=self.truncated.to(device),
        )

    def select(self, index: Tensor) -> Rollout:
        return Rollout(
            input_ids=self.input_ids[index],
            attention_mask=self.attention_mask[index],
            response_mask=self.response_mask[index],
            prompt_length=self.prompt_length,
            rewards=self.rewards[index],
            correct=self.correct[index],
            group_ids=self.group_ids[index],
            truncated=self.truncated[index],
            texts=[self.texts[i] for i in index.tolist()],
        )


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def concat_rollouts(parts: list[Rollout], pad_token_id: int) -> Rollout:
    """Joins rollouts whose prompt/response widths differ by re-padding prompts left and responses right."""
    if len(parts) == 1:
        return parts[0]
    p_max = max(r.prompt_length for r in parts)
    r_max = max(r.response_mask.shape[1] for r in parts)
    ids, attn, resp = [], [], []
    for r in parts:
        p_pad, r_pad = p_max - r.prompt_length, r_max - r.response_mask.shape[1]
        ids.append(torch.nn.functional.pad(r.input_ids, (p_pad, r_pad), value=pad_token_id))
        attn.append(torch.nn.functional.pad(r.attention_mask, (p_pad, r_pad), value=0))
        resp.append(torch.nn.functional.pad(r.response_mask, (0, r_pad), value=0.0))
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
    )


def hf_model(model: Any) -> Any:
    """The transformers model inside DDP and peft wrappers."""
    inner = getattr(model, "module", model)
    get_base_model = getattr(inner, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else inner


def model_device(model: Any) -> torch.device:
    """Where the model's weights live (the first parameter's device)."""
    return next(iter(model.parameters())).device


def cache_argument(model: Any) -> str:
    """The forward/generate keyword of the KV cache: transformers 5.x renamed past_key_values to cache."""
    model_class: Any = type(hf_model(model))
    return _cache_argument_of(model_class)


@functools.cache
def _cache_argument_of(model_class: Any) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


@torch.no_grad()
def shared_prompt_cache(
    model: Any, prompt_ids: Tensor, prompt_mask: Tensor, num_samples: int
) -> DynamicCache:
    """KV cache of the left-padded prompts (n, P) without their last token, repeated to n · num_samples rows.

    One forward over n rows instead of n · num_samples; position ids as generate derives them. The rows
    hold what a prefill of the repeated prompts would hold, up to float rounding of the smaller matmuls.
    """
    cache = DynamicCache(config=hf_model(model).config)
    model(
        input_ids=prompt_ids[:, :-1],
        attention_mask=prompt_mask[:, :-1],
        position_ids=position_ids_from_mask(prompt_mask[:, :-1]),
        use_cache=True,
        logits_to_keep=1,
        **{cache_argument(model): cache},
    )
    cache.batch_repeat_interleave(num_samples)
    return cache


def response_mask_from_eos(responses: Tensor, eos_token_id: int | list[int]) -> tuple[Tensor, Tensor]:
    """(B, R) ids → (mask up to and including the first EOS, truncated flag)."""
    eos_ids = torch.tensor(
        eos_token_id if isinstance(eos_token_id, list) else [eos_token_id], device=responses.device
    )
    is_eos = torch.isin(responses, eos_ids)  # (B, R)
    seen_before = torch.cumsum(is_eos.long(), dim=-1) - is_eos.long()  # EOS strictly before t
    mask = (seen_before == 0).float()
    truncated = ~is_eos.any(-1)
    return mask, truncated


@torch.no_grad()
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
) -> tuple[Tensor, Tensor, Tensor, Tensor, int]:
    """(input_ids (B, P+R), attention_mask, response_mask (B, R), truncated (B,), P); B = prompts × samples.

    Runs on the model's device; what it returns is on the CPU (texts are decoded and scored there).
    """
    device = model_device(model)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens)
    enc = {key: enc[key].to(device) for key in ("input_ids", "attention_mask")}
    prompt_ids = enc["input_ids"].repeat_interleave(num_samples, dim=0)
    prompt_mask = enc["attention_mask"].repeat_interleave(num_samples, dim=0)
    gen_config = model.generation_config
    eos = gen_config.eos_token_id if gen_config.eos_token_id is not None else tokenizer.eos_token_id
    kwargs: dict[str, object] = {
        "max_new_tokens": max_new_tokens,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": eos,
        "use_cache": True,
    }
    if greedy:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
    # Inference mode, not only no-grad: no version counters or autograd bookkeeping on the ~150 small ops of
    # every decode forward (−4 % generation time on tiny-arith). Its tensors cannot be saved for backward,
    # so what leaves this block is copied out of it (`to(copy=True)` outside the block gives a normal tensor).
    with torch.inference_mode():
        if num_samples > 1 and enc["input_ids"].shape[1] > 1:
            # The samples of a prompt share its KV cache: prefill each distinct prompt once (all but its
            # last token, which generate runs itself) and repeat the cache, instead of prefilling it G times.
            kwargs[cache_argument(model)] = shared_prompt_cache(
                model, enc["input_ids"], enc["attention_mask"], num_samples
            )
        out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **kwargs)
    out = out.to("cpu", copy=True)
    prompt_mask = prompt_mask.cpu()
    p_len = prompt_ids.shape[1]
    responses = out[:, p_len:]
    response_mask, truncated = response_mask_from_eos(responses, eos)
    attention_mask = torch.cat([prompt_mask, response_mask.long()], dim=1)
    return out, attention_mask, response_mask, truncated, p_len


def rollout(
    model: Any,
    tokenizer: Any,
    examples: list[Example],
    group_offset: int,
    spec: TrainSpec,
) -> Rollout:
    """Samples spec.sampling.group_size responses per example and scores them."""
    g = spec.sampling.group_size
    prompts = [
        render_prompt(ex, spec.task.prompt_template, tokenizer, use_chat_template=spec.task.use_chat_template)
        for ex in examples
    ]
    input_ids, attention_mask, response_mask, truncated, p_len = generate(
        model,
        tokenizer,
        prompts,
        num_samples=g,
        temperature=spec.sampling.temperature,
        top_p=spec.sampling.top_p,
        max_new_tokens=spec.sampling.max_new_tokens,
        add_special_tokens=not spec.task.use_chat_template,
    )
    responses = input_ids[:, p_len:]
    lengths = response_mask.sum(-1).long().tolist()
    texts = tokenizer.batch_decode(
        [row[:n] for row, n in zip(responses.tolist(), lengths)], skip_special_tokens=True
    )
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
    group_ids = torch.arange(group_offset, group_offset + len(examples)).repeat_interleave(g)
    return Rollout(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        prompt_length=p_len,
        rewards=rewards,
        correct=correct,
        group_ids=group_ids,
        truncated=truncated,
        texts=texts,
    )


def resolved_overlong(spec: TrainSpec) -> int | None:
    """DAPO's overlong buffer length: the spec's, or a quarter of the budget for dapo by default."""
    if spec.reward.overlong is not None:
        return spec.reward.overlong.cache_length
    if spec.algorithm.name == "dapo":
        return max(1, spec.sampling.max_new_tokens // 4)
    return None


def reflection_rate(texts: list[str]) -> float:
    """Mean number of reflection phrases ("wait", "however", "let me check", ...) per response."""
    if not texts:
        return 0.0
    return sum(len(REFLECTION_PATTERN.findall(t)) for t in texts) / len(texts)
