"""Per-token log-probability, entropy and the entropy-sensitivity correction C(p), chunk by chunk.

For every scored position with logits z (already the model's output) and sampled token a, at sampling
temperature T (logits are divided by T before anything else, ALGORITHMS.md §Notation):

    log p_a = z_a/T − logsumexp(z/T)
    H       = −Σ_k p_k log p_k                      (nats)
    C(p)    = Σ_k p_k² (s_k − H),  s_k = −log p_k    (≤ 0; STARE's first-order entropy analysis, §1)

Memory: the full-vocabulary fp32 log-softmax of the batch is never built. Rows are processed in chunks;
each chunk is upcast to fp32, reduced to three numbers per row, and dropped. The log-probability is
differentiable through a custom autograd function whose backward rebuilds softmax one chunk at a time,
so nothing of size (rows, V) is saved for backward beyond the logits that already exist. Entropy and C are
diagnostics and selectors: they carry no gradient.

`token_stats_from_hidden` goes one step further and fuses the LM head: hidden states (N, D) and the head
weight (V, D) go in, logits exist only one chunk at a time, and backward recomputes each chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

DEFAULT_CHUNK_ROWS = 1024


@dataclass(frozen=True)
class TokenStats:
    """Per-token results, shaped like the target ids. `entropy`/`correction` are None when not asked for."""

    logprob: Tensor  # fp32; differentiable when the input requires grad
    entropy: Tensor | None  # fp32 nats, no grad
    correction: Tensor | None  # fp32 C(p), no grad


def _check_temperature(temperature: float) -> None:
    if not (temperature > 0.0) or temperature != temperature or temperature == float("inf"):
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")


def _check_chunk(chunk_rows: int) -> None:
    if int(chunk_rows) != chunk_rows or chunk_rows < 1:
        raise ValueError(f"chunk_rows must be a positive integer, got {chunk_rows!r}")


def _fp32_scaled_copy(chunk: Tensor, temperature: float) -> Tensor:
    """A fresh fp32 buffer holding chunk / T (callers modify it in place; fp32 .float() would alias)."""
    if chunk.dtype == torch.float32:
        return chunk.div(temperature)
    return chunk.float().div_(temperature)


def _chunk_reductions(
    z: Tensor, targets: Tensor, want_entropy: bool, want_correction: bool
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """z: fp32 (n, V) already divided by T; modified in place. Returns (logprob, lse, H, C)."""
    lse = torch.logsumexp(z, dim=-1)  # (n,)
    logprob = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse  # (n,)
    if not (want_entropy or want_correction):
        return logprob, lse, None, None
    logp = z.sub_(lse.unsqueeze(-1))  # (n, V) log-probabilities, in place of z
    p = logp.exp()  # (n, V)
    # Row-wise dot products through bmm: no (n, V) temporary for the products.
    neg_entropy = torch.bmm(p.unsqueeze(1), logp.unsqueeze(2)).view(-1)  # Σ p log p
    entropy = -neg_entropy
    correction = None
    if want_correction:
        # C = Σ p² (−log p − H) = −Σ p² log p − H Σ p²
        p_sq = p.mul_(p)  # reuse p's storage
        sum_p_sq_logp = torch.bmm(p_sq.unsqueeze(1), logp.unsqueeze(2)).view(-1)
        correction = -sum_p_sq_logp - entropy * p_sq.sum(-1)
    return logprob, lse, (entropy if want_entropy else None), correction


class _ChunkedLogProb(torch.autograd.Function):
    """log p_a from logits, chunk by chunk; entropy and C returned as non-differentiable extras."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        targets: Tensor,
        temperature: float,
        chunk_rows: int,
        want_entropy: bool,
        want_correction: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        n = logits.shape[0]
        logprob = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        entropy = torch.empty(n if want_entropy else 0, dtype=torch.float32, device=logits.device)
        correction = torch.empty(n if want_correction else 0, dtype=torch.float32, device=logits.device)
        for start in range(0, n, chunk_rows):
            stop = min(start + chunk_rows, n)
            z = _fp32_scaled_copy(logits[start:stop], temperature)
            lp, ls, h, c = _chunk_reductions(z, targets[start:stop], want_entropy, want_correction)
            logprob[start:stop] = lp
            lse[start:stop] = ls
            if h is not None:
                entropy[start:stop] = h
            if c is not None:
                correction[start:stop] = c
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        ctx.chunk_rows = chunk_rows
        ctx.mark_non_differentiable(entropy, correction)
        return logprob, entropy, correction

    @staticmethod
    def backward(
        ctx: Any, grad_logprob: Tensor, _grad_entropy: Tensor, _grad_correction: Tensor
    ) -> tuple[Tensor | None, ...]:
        logits, targets, lse = ctx.saved_tensors
        temperature: float = ctx.temperature
        grad_logits = torch.empty_like(logits)
        n = logits.shape[0]
        for start in range(0, n, ctx.chunk_rows):
            stop = min(start + ctx.chunk_rows, n)
            g = grad_logprob[start:stop].to(torch.float32)  # (n,)
            # d log p_a / d z_k = (1[k=a] − p_k) / T
            p = _fp32_scaled_copy(logits[start:stop], temperature).sub_(lse[start:stop].unsqueeze(-1)).exp_()
            grad = p.mul_(-(g / temperature).unsqueeze(-1))
            grad.scatter_add_(-1, targets[start:stop].unsqueeze(-1), (g / temperature).unsqueeze(-1))
            grad_logits[start:stop] = grad
        return grad_logits, None, None, None, None, None


def token_stats_from_logits(
    logits: Tensor,
    target_ids: Tensor,
    *,
    temperature: float = 1.0,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    with_entropy: bool = True,
    with_correction: bool = True,
) -> TokenStats:
    """Scores `target_ids` (shape S) under `logits` (shape S + (V,)), any float dtype, in fp32 per chunk."""
    _check_temperature(temperature)
    _check_chunk(chunk_rows)
    if logits.dim() < 1 or logits.shape[:-1] != target_ids.shape:
        raise ValueError(
            f"target_ids shape {tuple(target_ids.shape)} must equal logits shape without the vocabulary "
            f"dimension {tuple(logits.shape[:-1])}"
        )
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {logits.dtype}")
    lead_shape = target_ids.shape
    flat_logits = logits.reshape(-1, logits.shape[-1])  # (N, V)
    flat_targets = target_ids.reshape(-1).long()  # (N,)
    logprob, entropy, correction = _ChunkedLogProb.apply(
        flat_logits, flat_targets, float(temperature), int(chunk_rows), with_entropy, with_correction
    )
    return TokenStats(
        logprob=logprob.view(lead_shape),
        entropy=entropy.view(lead_shape) if with_entropy else None,
        correction=correction.view(lead_shape) if with_correction else None,
    )


class _FusedHeadLogProb(torch.autograd.Function):
    """log p_a from hidden states and the LM head, never holding more than one chunk of logits."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        temperature: float,
        chunk_rows: int,
        want_entropy: bool,
        want_correction: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        n = hidden.shape[0]
        logprob = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n if want_entropy else 0, dtype=torch.float32, device=hidden.device)
        correction = torch.empty(n if want_correction else 0, dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk_rows):
            stop = min(start + chunk_rows, n)
            z = torch.nn.functional.linear(hidden[start:stop], weight, bias).to(torch.float32)
            z = z.div_(temperature)
            lp, ls, h, c = _chunk_reductions(z, targets[start:stop], want_entropy, want_correction)
            logprob[start:stop] = lp
            lse[start:stop] = ls
            if h is not None:
                entropy[start:stop] = h
            if c is not None:
                correction[start:stop] = c
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature = temperature
        ctx.chunk_rows = chunk_rows
        ctx.mark_non_differentiable(entropy, correction)
        return logprob, entropy, correction

    @staticmethod
    def backward(
        ctx: Any, grad_logprob: Tensor, _grad_entropy: Tensor, _grad_correction: Tensor
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        temperature: float = ctx.temperature
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        )
        grad_bias = (
            torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
            if (need_bias and bias is not None)
            else None
        )
        n = hidden.shape[0]
        for start in range(0, n, ctx.chunk_rows):
            stop = min(start + ctx.chunk_rows, n)
            h = hidden[start:stop]
            g = grad_logprob[start:stop].to(torch.float32) / temperature  # (n,)
            z = torch.nn.functional.linear(h, weight, bias).to(torch.float32)
            p = z.div_(temperature).sub_(lse[start:stop].unsqueeze(-1)).exp_()
            grad_z = p.mul_(-g.unsqueeze(-1))
            grad_z.scatter_add_(-1, targets[start:stop].unsqueeze(-1), g.unsqueeze(-1))  # (n, V) fp32
            if grad_hidden is not None:
                grad_hidden[start:stop] = (grad_z.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight.addmm_(grad_z.t(), h.to(torch.float32))
            if grad_bias is not None:
                grad_bias.add_(grad_z.sum(0))
        return (
            grad_hidden,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None else None,
            None,
            None,
            None,
            None,
            None,
        )


def token_stats_from_hidden(
    hidden: Tensor,
    lm_head_weight: Tensor,
    target_ids: Tensor,
    *,
    lm_head_bias: Tensor | None = None,
    temperature: float = 1.0,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    with_entropy: bool = True,
    with_correction: bool = True,
) -> TokenStats:
    """Like `token_stats_from_logits`, from hidden states (S + (D,)) and the head weight (V, D)."""
    _check_temperature(temperature)
    _check_chunk(chunk_rows)
    if hidden.shape[:-1] != target_ids.shape:
        raise ValueError(
            f"target_ids shape {tuple(target_ids.shape)} must equal hidden shape without the model "
            f"dimension {tuple(hidden.shape[:-1])}"
        )
    if lm_head_weight.dim() != 2 or lm_head_weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"lm_head_weight must be (V, {hidden.shape[-1]}), got {tuple(lm_head_weight.shape)}")
    if lm_head_bias is not None and lm_head_bias.shape != (lm_head_weight.shape[0],):
        raise ValueError(
            f"lm_head_bias must be ({lm_head_weight.shape[0]},), got {tuple(lm_head_bias.shape)}"
        )
    lead_shape = target_ids.shape
    logprob, entropy, correction = _FusedHeadLogProb.apply(
        hidden.reshape(-1, hidden.shape[-1]),
        lm_head_weight,
        lm_head_bias,
        target_ids.reshape(-1).long(),
        float(temperature),
        int(chunk_rows),
        with_entropy,
        with_correction,
    )
    return TokenStats(
        logprob=logprob.view(lead_shape),
        entropy=entropy.view(lead_shape) if with_entropy else None,
        correction=correction.view(lead_shape) if with_correction else None,
    )


def token_stats_reference(logits: Tensor, target_ids: Tensor, *, temperature: float = 1.0) -> TokenStats:
    """The naive full-tensor computation, kept as the test and benchmark reference. Memory: O(N·V) fp32."""
    _check_temperature(temperature)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (..., V)
    logprob = logp.gather(-1, target_ids.long().unsqueeze(-1)).squeeze(-1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)
    correction = (p * p * (-logp - entropy.unsqueeze(-1))).sum(-1)
    return TokenStats(logprob=logprob, entropy=entropy.detach(), correction=correction.detach())
