"""The SFT warm-start: supervised steps on the task's answers (or code-generated tool-use transcripts)
before RL, with its own optimiser and learning-rate schedule (spec.sft)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from contract.protocol import EventType
from contract.spec import SftSpec, TrainSpec
from trainer.distributed.runtime import Runtime
from trainer.envs.tool_use import transcript
from trainer.tasks.sources import Example, render_prompt

SFT_SCHEDULES = ("constant", "cosine")


def sft_lr_factor(sft: SftSpec, i: int) -> float:
    """Multiplier of sft.lr at SFT step i (0-based): linear warm-up, then constant or cosine decay that
    reaches sft.min_lr_ratio at the last step."""
    if sft.schedule not in SFT_SCHEDULES:
        raise ValueError(f"sft schedule must be one of {', '.join(SFT_SCHEDULES)}, got {sft.schedule!r}")
    if i < sft.warmup_steps:
        return (i + 1) / sft.warmup_steps
    if sft.schedule == "constant":
        return 1.0
    span = max(1, sft.steps - 1 - sft.warmup_steps)
    progress = min(1.0, (i - sft.warmup_steps) / span)
    return sft.min_lr_ratio + (1.0 - sft.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def sft_loss(logits: Tensor, labels: Tensor, label_smoothing: float) -> Tensor:
    """Token-mean cross-entropy of next-token predictions against (1 − ε)·one-hot(label) + ε/V, over the
    positions whose label is not −100. Position t predicts label t + 1, as in the model's own loss."""
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        labels[:, 1:].reshape(-1),
        ignore_index=-100,
        label_smoothing=label_smoothing,
    )


def run_sft(
    model: torch.nn.Module,
    tokenizer: Any,
    runtime: Runtime,
    spec: TrainSpec,
    examples: list[Example],
    emit: Callable[[dict[str, Any]], None],
) -> None:
    """spec.sft.steps of supervised training on random training examples (this process's share of each
    batch), emitting an `sft` event every 100 steps and at the last."""
    sft = spec.sft
    assert sft is not None
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=sft.lr,
        betas=(0.9, sft.adam_beta2),
        weight_decay=sft.weight_decay,
    )
    params = [p for group in opt.param_groups for p in group["params"]]
    gen = torch.Generator().manual_seed(spec.seed + 11)
    rank, world = runtime.rank, runtime.world_size
    model.train()
    loss_value = float("nan")
    for i in range(sft.steps):
        idx = torch.randint(len(examples), (sft.batch_size,), generator=gen).tolist()
        exs = [examples[j] for j in idx[rank::world]]
        ids, attn, labels = sft_batch(tokenizer, spec, exs)
        ids, attn, labels = (
            ids.to(runtime.device),
            attn.to(runtime.device),
            labels.to(runtime.device),
        )
        position_ids = (attn.cumsum(-1) - 1).clamp_min(0)
        if sft.label_smoothing > 0:
            logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits
            loss = sft_loss(logits, labels, sft.label_smoothing)
        else:
            loss = model(input_ids=ids, attention_mask=attn, position_ids=position_ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        runtime.backward(loss)
        if sft.grad_clip is not None:
            runtime.clip_grad_norm_(params, sft.grad_clip)  # a global norm over shards too
        for group in opt.param_groups:
            group["lr"] = sft.lr * sft_lr_factor(sft, i)
        opt.step()
        loss_value = float(loss.detach())
        if (i + 1) % 100 == 0 or i + 1 == sft.steps:
            emit({"type": EventType.SFT, "step": i + 1, "total": sft.steps, "loss": loss_value})
    # The RL update accumulates into .grad (its optimiser zeroes after each step, not before the first):
    # left in place, the last SFT step's gradient would be added to RL step 1's (seen: a step-1 gradient
    # norm of 1.19 on a batch whose advantages were all 0).
    opt.zero_grad(set_to_none=True)


def sft_batch(tokenizer: Any, spec: TrainSpec, exs: list[Example]) -> tuple[Tensor, Tensor, Tensor]:
    """(input_ids, attention_mask, labels) of the examples' prompt + answer rows, left-padded; labels are
    −100 off the targets (the answer and EOS, or a transcript's model turns)."""
    tok = tokenizer
    prompts = [
        render_prompt(e, spec.task.prompt_template, tok, use_chat_template=spec.task.use_chat_template)
        for e in exs
    ]
    p_enc = tok(prompts, add_special_tokens=not spec.task.use_chat_template)["input_ids"]
    if spec.environment is not None:
        seqs, targets = sft_transcripts(tok, spec, exs, p_enc)
    else:
        a_enc = tok([e.answer for e in exs], add_special_tokens=False)["input_ids"]
        seqs = [p + a + [tok.eos_token_id] for p, a in zip(p_enc, a_enc)]
        targets = [[False] * len(p) + [True] * (len(s) - len(p)) for s, p in zip(seqs, p_enc)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    labels = torch.full((len(seqs), width), -100)
    for row, (s, target) in enumerate(zip(seqs, targets)):
        ids[row, width - len(s) :] = torch.tensor(s)
        attn[row, width - len(s) :] = 1
        labels[row, width - len(s) :] = torch.where(torch.tensor(target), torch.tensor(s), torch.tensor(-100))
    return ids, attn, labels


def sft_transcripts(
    tokenizer: Any, spec: TrainSpec, examples: list[Example], prompt_ids: list[list[int]]
) -> tuple[list[list[int]], list[list[bool]]]:
    """Tool-use SFT rows: the prompt, then a code-generated episode (trainer.envs.tool_use.transcript),
    each model turn closed by EOS; the targets are the model turns' tokens only (tool results, like in
    RL, are context and never a label)."""
    env = spec.environment
    assert env is not None
    tok = tokenizer
    seqs, targets = [], []
    for example, prompt in zip(examples, prompt_ids):
        seq, target = list(prompt), [False] * len(prompt)
        for text, is_model in transcript(example, env):
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
            if is_model:
                ids.append(tok.eos_token_id)
            else:
                ids = ids[: env.max_result_tokens]
            seq += ids
            target += [is_model] * len(ids)
        seqs.append(seq)
        targets.append(target)
    return seqs, targets
