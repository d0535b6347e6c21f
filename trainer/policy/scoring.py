"""The scoring pass: each response token's log-prob, entropy and C(p) under the policy, over chosen rows.

`response_stats` is what the update, π_old and the reference policy call; `response_logits` runs a group's
shared prompt once. Also the model checks the engine makes once (`align_tensors`,
`forward_is_deterministic`) and the micro-batch split.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache

from trainer.algos import token_stats_from_logits
from trainer.models import hf_model
from trainer.rollout.batch import Rollout
from trainer.rollout.generation import cache_argument


def response_stats(
    model: torch.nn.Module,
    batch: Rollout,
    index: Tensor,
    temperature: float,
    *,
    with_entropy: bool,
    skip_rows: Tensor | None = None,
    entropy_grad: bool = False,
    share_prompts: bool | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Log-prob (grad if enabled), entropy and C of each response token of the rows `index`. (b, R).

    skip_rows: (b,) bool, the rows of the zero-advantage skip (`zero_advantage_skip`; None: none). With grad
    enabled they come back detached: read from the rollout's sample stats when it carries them (no forward
    at all), else from a second forward without autograd. The values are the same up to float rounding
    (other matmul shapes).
    entropy_grad: the entropy carries its gradient too (a loss with an entropy term): on every row, or with
    `skip_rows` on the rows that keep their graph (a loss whose entropy term is inert on the skipped ones).
    share_prompts: passed to `response_logits` (None: each call decides by its rows).
    """
    if skip_rows is not None and torch.is_grad_enabled() and bool(skip_rows.any()):
        return _stats_skipping_rows(
            model, batch, index, temperature, skip_rows, with_entropy=with_entropy, entropy_grad=entropy_grad
        )
    input_ids = batch.input_ids[index]
    logits = response_logits(
        model, input_ids, batch.attention_mask[index], batch.position_ids()[index], batch.prompt_length,
        share_prompts=share_prompts,
    )  # fmt: skip
    stats = token_stats_from_logits(
        logits,
        input_ids[:, batch.prompt_length :],
        temperature=temperature,
        with_entropy=with_entropy,
        with_correction=with_entropy,
        entropy_grad=entropy_grad and torch.is_grad_enabled(),
        # The logits are this function's own intermediate: backward may write their gradient over them
        # instead of allocating another (rows, R, V) tensor (its size for a large model: docs/BENCHMARKS.md).
        grad_in_logits=torch.is_grad_enabled(),
    )
    return stats.logprob, stats.entropy, stats.correction


def _stats_skipping_rows(
    model: torch.nn.Module,
    batch: Rollout,
    index: Tensor,
    temperature: float,
    skip_rows: Tensor,
    *,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """`response_stats` with grad enabled and some rows skipped: the kept rows scored with their graph,
    the skipped ones detached (`_detached_stats`), joined back in the order of `index`."""
    keep = (~skip_rows).nonzero().squeeze(-1)
    rest = skip_rows.nonzero().squeeze(-1)
    detached = _detached_stats(model, batch, index[rest], temperature, with_entropy)
    if keep.numel() == 0:
        return detached
    attached = response_stats(
        model, batch, index[keep], temperature, with_entropy=with_entropy, entropy_grad=entropy_grad
    )
    order = torch.empty_like(index)
    order[torch.cat([keep, rest])] = torch.arange(index.numel(), device=index.device)
    joined = [
        None if a is None or d is None else torch.cat([a, d])[order] for a, d in zip(attached, detached)
    ]
    assert joined[0] is not None
    return joined[0], joined[1], joined[2]


def _detached_stats(
    model: torch.nn.Module, batch: Rollout, rows: Tensor, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The stats of `rows` without a graph: the rollout's sample stats when it carries them (no forward at
    all), else a forward without autograd."""
    if batch.sample_logprob is not None:
        assert batch.sample_entropy is not None and batch.sample_correction is not None
        return (
            batch.sample_logprob[rows],
            batch.sample_entropy[rows] if with_entropy else None,
            batch.sample_correction[rows] if with_entropy else None,
        )
    with torch.no_grad():
        return response_stats(model, batch, rows, temperature, with_entropy=with_entropy)


def response_logits(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    p_len: int,
    *,
    share_prompts: bool | None = None,
) -> Tensor:
    """(b, R, V) logits of rows (b, P + R): position t predicts response token t.

    Rows that share a prompt (the G samples of a group) run it once: a forward over the distinct prompts
    fills a KV cache (and gives the logits for response token 0), the cache is gathered back to the rows
    and the responses run on top of it. Same values as one forward over the whole rows up to float rounding
    (the matmuls have other shapes); the gradient reaches the shared prompt through the gather. The last
    response token only ever serves as a target, so it is not run.

    The shared-prompt path makes two forward calls, the full forward one. Where the processes meet in every
    forward call, each process must make the same calls whatever its rows, so the caller passes
    `share_prompts` as the run's strategy says (trainer.policy.update.micro_batch_plan): under DDP (each call
    syncs buffers) False, every call the full forward; in an FSDP2 training forward (each call all-gathers
    every layer, its backward reduce-scatters) the choice agreed over the processes for the step: True
    takes the shared-prompt path even where the rows share no prompt. None: by the rows (one process, or
    full weights).
    """
    b, width = input_ids.shape
    r_len = width - p_len
    prompts = torch.cat([input_ids[:, :p_len], attention_mask[:, :p_len]], dim=1)  # (b, 2P)
    distinct, inverse = torch.unique(prompts, dim=0, return_inverse=True)
    if share_prompts is None:
        share_prompts = distinct.shape[0] < b and prompts_shareable(p_len, width)
    elif share_prompts and not prompts_shareable(p_len, width):
        raise ValueError(f"share_prompts: rows of {p_len} prompt and {r_len} response tokens cannot share")
    if not share_prompts:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            logits_to_keep=r_len + 1,
            use_cache=False,
        )
        return out.logits[:, :-1, :]
    return _shared_prompt_logits(
        model, input_ids, attention_mask, position_ids, p_len, inverse, distinct.shape[0]
    )


def _shared_prompt_logits(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    p_len: int,
    inverse: Tensor,
    n_distinct: int,
) -> Tensor:
    """`response_logits`' shared-prompt path: the `n_distinct` prompts (`inverse`: each row's) run once into
    a KV cache, gathered back to the rows, and the responses run on top of it."""
    b, width = input_ids.shape
    r_len = width - p_len
    rows = torch.arange(b, device=input_ids.device)
    first = torch.full((n_distinct,), b, device=input_ids.device).scatter_reduce(
        0, inverse, rows, "amin"
    )  # (u,)
    cache = DynamicCache(config=hf_model(model).config)
    cache_kw = cache_argument(model)
    head = model(
        input_ids=input_ids[first, :p_len],
        attention_mask=attention_mask[first, :p_len],
        position_ids=position_ids[first, :p_len],
        logits_to_keep=1,
        use_cache=True,
        **{cache_kw: cache},
    )
    cache.batch_select_indices(inverse)
    tail = model(
        input_ids=input_ids[:, p_len:-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=position_ids[:, p_len:-1],
        logits_to_keep=r_len - 1,
        use_cache=True,
        **{cache_kw: cache},
    )
    return torch.cat([head.logits[inverse], tail.logits], dim=1)


def prompts_shareable(p_len: int, width: int) -> bool:
    """Whether rows of `width` tokens, `p_len` of them prompt, can take response_logits' shared-prompt path:
    a prompt to cache, and a response of two tokens at least (the last one is never run)."""
    return p_len >= 1 and width - p_len >= 2


def align_tensors(model: torch.nn.Module, alignment: int = 64) -> None:
    """Moves parameters and buffers that sit off a 64-byte boundary into fresh (aligned) memory.

    Weights read from safetensors can start at any 8-byte offset, and CPU matmul kernels round differently
    for misaligned operands in some shapes (small row counts): a run resumed from a checkpoint would then
    drift by float rounding from the uninterrupted run, whose weights torch allocated itself.
    """
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.data_ptr() % alignment:
                tensor.data = tensor.data.clone()


def forward_is_deterministic(model: torch.nn.Module) -> bool:
    """No dropout in train mode: no dropout module with p > 0 (LoRA's included), no attention dropout."""
    config = getattr(hf_model(model), "config", None)
    if float(getattr(config, "attention_dropout", 0.0) or 0.0) > 0.0:
        return False
    return not any(isinstance(m, torch.nn.Dropout) and m.p > 0.0 for m in model.modules())


def micro_batches(n: int, size: int) -> list[Tensor]:
    return [torch.arange(s, min(s + size, n)) for s in range(0, n, size)]
