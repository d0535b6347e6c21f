"""Fused GPU kernels (Triton) for the per-token log-prob, entropy and C(p) of `kernels.py`.

Same quantities and conventions as `token_stats_from_logits` (ALGORITHMS.md §2: logits divided by the
sampling temperature T, fp32 arithmetic whatever the logits' dtype, entropy and C without gradient), but
each row of the vocabulary is streamed through on-chip memory instead of materialised chunk by chunk:

- forward, one program per row, two passes over its V logits: (1) the running maximum and sum of
  exponentials give log Z = logsumexp(z/T); (2) with p_k = exp(z_k/T − log Z), the sums Σ p log p,
  Σ p² and Σ p² log p give H = −Σ p log p and C = Σ p² (−log p − H) = −Σ p² log p − H Σ p².
  log p_a = z_a/T − log Z. log Z is kept (4 bytes a row) for backward.
- backward of Σ g·log p_a: one pass, ∂/∂z_k = g (1[k = a] − p_k) / T, written in the logits' dtype.
  Each program reads a block of its row and then writes that block's gradient, and never reads the block
  again (the target's logit is not reloaded: it is handled inside its block), so with `grad_in_logits`
  the gradient pointer is the logits' own and backward allocates no (N, V) tensor.

Memory above the inputs: the outputs and log Z, O(N); no (rows, V) buffer at all. Traffic: the logits are
read twice forward and once backward, against the dozen full passes of an unfused computation.

Runs where Triton runs (CUDA); `TRITON_INTERPRET=1` runs the same kernels on CPU tensors through Triton's
interpreter, which is how the CPU test suite checks them against `token_stats_reference`.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from trainer.algos.logits_grad import require_no_graph_for_grad_in_logits

MAX_BLOCK = 4096  # vocabulary entries per step of a program's loop
NUM_WARPS = 8


@triton.jit
def _stats_forward(
    logits_ptr,
    row_stride,
    targets_ptr,
    logprob_ptr,
    entropy_ptr,
    correction_ptr,
    lse_ptr,
    vocab,
    inv_temperature,
    WANT_ENTROPY: tl.constexpr,
    WANT_CORRECTION: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    offsets = tl.arange(0, BLOCK)

    # Pass 1: log Z by a running maximum and a rescaled running sum of exponentials.
    running_max = float("-inf")
    running_sum = 0.0
    for start in range(0, vocab, BLOCK):
        cols = start + offsets
        z = tl.load(base + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32) * inv_temperature
        new_max = tl.maximum(running_max, tl.max(z, axis=0))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(z - new_max), axis=0)
        running_max = new_max
    lse = running_max + tl.log(running_sum)
    target = tl.load(targets_ptr + row)
    # A target outside [0, V) reads nothing and gives a NaN log-prob (the engine stops on NaN).
    in_range = (target >= 0) & (target < vocab)
    z_target = tl.load(base + target, mask=in_range, other=float("nan")).to(tl.float32) * inv_temperature
    tl.store(logprob_ptr + row, z_target - lse)
    tl.store(lse_ptr + row, lse)

    # Pass 2: Σ p log p, and for C also Σ p² and Σ p² log p.
    if WANT_ENTROPY or WANT_CORRECTION:
        p_logp = tl.zeros((BLOCK,), dtype=tl.float32)
        p_sq = tl.zeros((BLOCK,), dtype=tl.float32)
        p_sq_logp = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + offsets
            valid = cols < vocab
            z = tl.load(base + cols, mask=valid, other=0.0).to(tl.float32) * inv_temperature
            logp = z - lse
            p = tl.where(valid, tl.exp(logp), 0.0)
            p_logp += p * logp
            if WANT_CORRECTION:
                p_sq += p * p
                p_sq_logp += p * p * logp
        entropy = -tl.sum(p_logp, axis=0)
        if WANT_ENTROPY:
            tl.store(entropy_ptr + row, entropy)
        if WANT_CORRECTION:
            correction = -tl.sum(p_sq_logp, axis=0) - entropy * tl.sum(p_sq, axis=0)
            tl.store(correction_ptr + row, correction)


@triton.jit
def _logprob_backward(
    logits_ptr,
    row_stride,
    grad_ptr,
    grad_row_stride,
    targets_ptr,
    lse_ptr,
    grad_logprob_ptr,
    vocab,
    inv_temperature,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    out = grad_ptr + row * grad_row_stride
    offsets = tl.arange(0, BLOCK)
    g = tl.load(grad_logprob_ptr + row).to(tl.float32)
    lse = tl.load(lse_ptr + row)
    target = tl.load(targets_ptr + row)
    for start in range(0, vocab, BLOCK):
        cols = start + offsets
        valid = cols < vocab
        z = tl.load(base + cols, mask=valid, other=0.0).to(tl.float32) * inv_temperature
        grad = -g * tl.exp(z - lse)
        grad = tl.where(cols == target, grad + g, grad) * inv_temperature
        tl.store(out + cols, grad.to(grad_ptr.dtype.element_ty), mask=valid)


def _block(vocab: int) -> int:
    return min(MAX_BLOCK, triton.next_power_of_2(vocab))


class TritonLogProb(torch.autograd.Function):
    """log p_a from (N, V) logits with a fused Triton kernel; entropy and C as non-differentiable extras."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        targets: Tensor,
        temperature: float,
        want_entropy: bool,
        want_correction: bool,
        grad_in_logits: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        if logits.stride(-1) != 1:
            logits = logits.contiguous()
        n, vocab = logits.shape
        device = logits.device
        logprob = torch.empty(n, dtype=torch.float32, device=device)
        lse = torch.empty(n, dtype=torch.float32, device=device)
        entropy = torch.empty(n if want_entropy else 0, dtype=torch.float32, device=device)
        correction = torch.empty(n if want_correction else 0, dtype=torch.float32, device=device)
        if n:
            _stats_forward[(n,)](
                logits,
                logits.stride(0),
                targets,
                logprob,
                entropy if want_entropy else logprob,
                correction if want_correction else logprob,
                lse,
                vocab,
                1.0 / temperature,
                WANT_ENTROPY=want_entropy,
                WANT_CORRECTION=want_correction,
                BLOCK=_block(vocab),
                num_warps=NUM_WARPS,
            )
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        ctx.grad_in_logits = grad_in_logits
        ctx.mark_non_differentiable(entropy, correction)
        return logprob, entropy, correction

    @staticmethod
    def backward(
        ctx: Any, grad_logprob: Tensor, _grad_entropy: Tensor, _grad_correction: Tensor
    ) -> tuple[Tensor | None, ...]:
        # Unpacking checks the logits' version: a second backward after grad_in_logits wrote over them
        # (retain_graph) raises here.
        logits, targets, lse = ctx.saved_tensors
        n, vocab = logits.shape
        if ctx.grad_in_logits:
            require_no_graph_for_grad_in_logits()
            # Unit stride along V (forward made sure of it); rows never overlap (the caller copies logits
            # whose elements share memory). Each block is loaded before it is overwritten, and only once.
            grad_logits = logits.detach()
        else:
            grad_logits = torch.empty_like(logits, memory_format=torch.contiguous_format)
        if n:
            _logprob_backward[(n,)](
                logits,
                logits.stride(0),
                grad_logits,
                grad_logits.stride(0),
                targets,
                lse,
                grad_logprob.contiguous(),
                vocab,
                1.0 / ctx.temperature,
                BLOCK=_block(vocab),
                num_warps=NUM_WARPS,
            )
        if ctx.grad_in_logits:
            # The kernel wrote through a raw pointer, which autograd does not see: bump the logits' version
            # as an in-place op would, so every later unpack of the saved logits fails loudly.
            torch.autograd.graph.increment_version(logits)
        return grad_logits, None, None, None, None, None
