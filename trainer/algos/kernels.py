"""Per-token log-probability, entropy and the entropy-sensitivity correction C(p), chunk by chunk.

For every scored position with logits z (already the model's output) and sampled token a, at sampling
temperature T (logits are divided by T before anything else, ALGORITHMS.md §Notation):

    log p_a = z_a/T − logsumexp(z/T)
    H       = −Σ_k p_k log p_k                      (nats)
    C(p)    = Σ_k p_k² (s_k − H),  s_k = −log p_k    (≤ 0; STARE's first-order entropy analysis, §1)

Memory: the full-vocabulary fp32 log-softmax of the batch is never built. Rows are processed in chunks;
each chunk is upcast to fp32 and reduced to three numbers per row in a few (chunk_rows, V) fp32 buffers
that every chunk of the call reuses (at most three: 0.87 GiB at the default 512 rows and V = 151,936).
The per-chunk operations are the reference's own (log_softmax, exp, elementwise products, row sums), so
on CPU the values equal `token_stats_reference` bit for bit. The log-probability is differentiable through a custom
autograd function whose backward rebuilds softmax one chunk at a time, so nothing of size (rows, V) is
saved for backward beyond the logits that already exist; with `grad_in_logits=True` backward also
allocates no gradient of their size, writing it over the logits (see `token_stats_from_logits`). Entropy
and C are diagnostics and selectors: they carry no gradient, except where a loss term needs the entropy's
own (an entropy bonus): `entropy_grad=True` makes H differentiable too, with ∂H/∂z_k = p_k (s_k − H)/T
added in the same chunked backward (torch path only; ALGORITHMS §1 gives the closed form).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from trainer.algos.logits_grad import require_no_graph_for_grad_in_logits

# bench/bench_kernels.py's sweep (docs/BENCHMARKS.md): 512 rows is as fast as 1,024 on CPU with half
# the chunk memory; smaller chunks get slower.
DEFAULT_CHUNK_ROWS = 512


@dataclass(frozen=True)
class TokenStats:
    """Per-token results, shaped like the target ids. `entropy`/`correction` are None when not asked for."""

    logprob: Tensor  # fp32; differentiable when the input requires grad
    entropy: Tensor | None  # fp32 nats; no grad unless asked for (entropy_grad)
    correction: Tensor | None  # fp32 C(p), no grad


def _check_temperature(temperature: float) -> None:
    if not (temperature > 0.0) or temperature != temperature or temperature == float("inf"):
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")


def _check_chunk(chunk_rows: int) -> None:
    if int(chunk_rows) != chunk_rows or chunk_rows < 1:
        raise ValueError(f"chunk_rows must be a positive integer, got {chunk_rows!r}")


def _check_flag(name: str, value: bool) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")


def _no_internal_overlap(tensor: Tensor) -> bool:
    """Whether no two elements of `tensor` share memory (a sufficient test: with the dimensions ordered by
    stride, each stride exceeds the span of the smaller ones). False for expanded (stride 0) views."""
    span = 0  # largest offset reachable through the dimensions seen so far
    for stride, size in sorted((tensor.stride(d), tensor.size(d)) for d in range(tensor.dim())):
        if size == 1:
            continue
        if stride <= span:
            return False
        span += (size - 1) * stride
    return True


class _ChunkBuffers:
    """(rows, V) work buffers made on first use and reused by every chunk of one call.

    Allocating per chunk would, on CPU, map and fault in fresh pages for every chunk (blocks this large
    bypass the allocator's free lists) and costs as much time as the arithmetic; one set of buffers keeps
    the working set at a few chunks whatever the number of chunks. (On CUDA the caching allocator would
    reuse the blocks anyway.)
    """

    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        self._shape = (rows, vocab)
        self._device = device
        self._buffers: dict[str, Tensor] = {}

    def get(self, name: str, rows: int, dtype: torch.dtype = torch.float32) -> Tensor:
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype:
            buffer = torch.empty(self._shape, dtype=dtype, device=self._device)
            self._buffers[name] = buffer
        return buffer[:rows]


def _scaled_fp32(chunk: Tensor, temperature: float, buffers: _ChunkBuffers) -> Tensor:
    """chunk / T in fp32 with the values `logits.float() / T` has. The chunk itself when it is fp32 and
    T = 1 (it is only read, never modified); otherwise the "spare" buffer."""
    if chunk.dtype == torch.float32 and temperature == 1.0:
        return chunk
    z = buffers.get("spare", chunk.shape[0])
    z.copy_(chunk)
    return z.div_(temperature) if temperature != 1.0 else z


def _chunk_reductions(
    z: Tensor, targets: Tensor, buffers: _ChunkBuffers, want_entropy: bool, want_correction: bool
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """z: fp32 (n, V), already divided by T; only read. Returns (logprob, H, C), each (n,) fp32.

    The operations and their order are those of `token_stats_reference` (log_softmax, exp, elementwise
    products, row sums), so on CPU the results equal it bit for bit: rows are independent and a row's
    reduction does not depend on how many rows share the call. (A BLAS row-dot would save one buffer
    but loses ~1e-4 relative accuracy in H at V ≈ 150k.) z may be the "spare" buffer: it is dead once
    the log-softmax is taken, and "spare" is reused for the products.
    """
    n = z.shape[0]
    logp = torch.log_softmax(z, dim=-1, out=buffers.get("log_probs", n))  # (n, V)
    logprob = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (n,)
    if not (want_entropy or want_correction):
        return logprob, None, None
    p = torch.exp(logp, out=buffers.get("probs", n))  # (n, V)
    spare = buffers.get("spare", n)
    entropy = torch.mul(p, logp, out=spare).sum(-1).neg_()  # H = −Σ p log p
    correction = None
    if want_correction:
        # C = Σ p² (−log p − H), multiplied in the reference's order: (p·p)·((−log p) − H). The deviation
        # is formed as (−H) − log p in one pass: the same rounded value, as negation is exact.
        deviation = torch.sub(entropy.neg().unsqueeze(-1), logp, out=spare)
        correction = p.mul_(p).mul_(deviation).sum(-1)
    return logprob, entropy, correction


def _logprob_grad_chunk(
    z: Tensor,
    targets: Tensor,
    grad_logprob: Tensor,
    temperature: float,
    buffers: _ChunkBuffers,
    out: Tensor | None = None,
) -> Tensor:
    """∂(Σ g·log p_a)/∂(logits) = g·(e_a − p)/T for one chunk: fp32 (n, V), written into `out` (an fp32
    slice of the gradient) or else the "log_probs" buffer.

    p is rebuilt as autograd of the reference builds it (exp of the log-softmax) and the terms are formed
    in the same order, so the gradient equals autograd of the naive version to the last bit or two (the
    two use different vectorised exp routines).
    """
    g = grad_logprob.to(torch.float32).unsqueeze(-1)  # (n, 1)
    if out is None:
        out = buffers.get("log_probs", z.shape[0])
    grad = torch.log_softmax(z, dim=-1, out=out).exp_().mul_(g.neg())  # −p·g (negation is exact)
    grad.scatter_add_(-1, targets.unsqueeze(-1), g)  # + g at the sampled token
    return grad.div_(temperature) if temperature != 1.0 else grad


def _logprob_grad_into_chunk(
    chunk: Tensor,
    z: Tensor,
    targets: Tensor,
    grad_logprob: Tensor,
    temperature: float,
    buffers: _ChunkBuffers,
) -> None:
    """`_logprob_grad_chunk`'s gradient, written over `chunk` (this chunk's slice of the logits) in the
    logits' dtype, with the same values. z is `_scaled_fp32(chunk)`: either a copy of it in the "spare"
    buffer, or, for fp32 logits at T = 1, the chunk itself. No operation reads memory that it or an earlier
    one wrote over; no `out=` overlaps its input.
    """
    if chunk.dtype != torch.float32:
        # z is the fp32 "spare" copy: the gradient is built in "log_probs", then rounded into the chunk.
        chunk.copy_(_logprob_grad_chunk(z, targets, grad_logprob, temperature, buffers))
        return
    if z.data_ptr() != chunk.data_ptr():
        # z is the "spare" copy (T ≠ 1): the chunk is no longer read and takes the gradient directly.
        _logprob_grad_chunk(z, targets, grad_logprob, temperature, buffers, out=chunk)
        return
    # fp32 at T = 1: z is the chunk. The log-softmax reads all of it into "log_probs" before exp writes
    # the chunk; then the default path's operations, in its order (exp, ·(−g), + g at the target).
    g = grad_logprob.to(torch.float32).unsqueeze(-1)
    logp = torch.log_softmax(z, dim=-1, out=buffers.get("log_probs", z.shape[0]))
    torch.exp(logp, out=chunk).mul_(g.neg())
    chunk.scatter_add_(-1, targets.unsqueeze(-1), g)


def _add_entropy_grad_chunk(
    grad: Tensor, z: Tensor, entropy: Tensor, grad_entropy: Tensor, temperature: float, buffers: _ChunkBuffers
) -> None:
    """grad += g_H · p (−log p − H) / T for one chunk: ∂(Σ g_H·H)/∂(logits). `grad` is fp32 (n, V) and
    shares no memory with z or the "probs"/"entropy_grad" buffers."""
    n = z.shape[0]
    logp = torch.log_softmax(z, dim=-1, out=buffers.get("probs", n))
    p = torch.exp(logp, out=buffers.get("entropy_grad", n))
    g = grad_entropy.to(torch.float32).unsqueeze(-1)
    term = logp.neg_().sub_(entropy.unsqueeze(-1)).mul_(p).mul_(g)
    grad.add_(term.div_(temperature) if temperature != 1.0 else term)


def _store(out: Tensor, start: int, value: Tensor | None) -> None:
    if value is not None and out.numel():
        out[start : start + value.shape[0]] = value


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
        grad_in_logits: bool,
        entropy_grad: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor]:
        n, vocab = logits.shape
        device = logits.device
        logprob = torch.empty(n, dtype=torch.float32, device=device)
        entropy = torch.empty(n if want_entropy else 0, dtype=torch.float32, device=device)
        correction = torch.empty(n if want_correction else 0, dtype=torch.float32, device=device)
        buffers = _ChunkBuffers(min(chunk_rows, n), vocab, device)
        for start in range(0, n, chunk_rows):
            stop = min(start + chunk_rows, n)
            z = _scaled_fp32(logits[start:stop], temperature, buffers)
            lp, h, c = _chunk_reductions(z, targets[start:stop], buffers, want_entropy, want_correction)
            _store(logprob, start, lp)
            _store(entropy, start, h)
            _store(correction, start, c)
        ctx.save_for_backward(logits, targets, entropy if entropy_grad else None)
        ctx.temperature = temperature
        ctx.chunk_rows = chunk_rows
        ctx.grad_in_logits = grad_in_logits
        ctx.entropy_grad = entropy_grad
        if entropy_grad:
            ctx.mark_non_differentiable(correction)
        else:
            ctx.mark_non_differentiable(entropy, correction)
        return logprob, entropy, correction

    @staticmethod
    def backward(
        ctx: Any, grad_logprob: Tensor, grad_entropy: Tensor | None, _grad_correction: Tensor
    ) -> tuple[Tensor | None, ...]:
        # Unpacking checks the logits' version: a second backward after grad_in_logits wrote over them
        # (retain_graph) raises here.
        logits, targets, saved_entropy = ctx.saved_tensors
        if not ctx.entropy_grad or grad_entropy is None or grad_entropy.numel() == 0:
            saved_entropy = None
        temperature: float = ctx.temperature
        n, vocab = logits.shape
        buffers = _ChunkBuffers(min(ctx.chunk_rows, n), vocab, logits.device)
        if ctx.grad_in_logits:
            require_no_graph_for_grad_in_logits()
            # The logits' own storage, shape and strides, as a tensor without autograd history. Each chunk
            # is read (into "log_probs" or "spare") before its slice is written; no chunk reads another's
            # rows, so the slices already written are never read again.
            grad_logits = logits.detach()
        else:
            grad_logits = torch.empty_like(logits)
        for start in range(0, n, ctx.chunk_rows):
            stop = min(start + ctx.chunk_rows, n)
            chunk = logits[start:stop]
            z = _scaled_fp32(chunk, temperature, buffers)
            t, g = targets[start:stop], grad_logprob[start:stop]
            if ctx.grad_in_logits:
                _logprob_grad_into_chunk(chunk, z, t, g, temperature, buffers)
                continue
            # fp32 logits: the gradient is built in place in its slice of grad_logits (no copy).
            direct = grad_logits[start:stop] if grad_logits.dtype == torch.float32 else None
            grad = _logprob_grad_chunk(z, t, g, temperature, buffers, out=direct)
            if saved_entropy is not None:
                assert grad_entropy is not None
                h, g_h = saved_entropy[start:stop], grad_entropy[start:stop]
                _add_entropy_grad_chunk(grad, z, h, g_h, temperature, buffers)
            if direct is None:
                grad_logits[start:stop] = grad
        return grad_logits, None, None, None, None, None, None, None


def triton_available() -> bool:
    """Whether the fused Triton kernels can be imported (Triton is installed with a working backend)."""
    global _TRITON_OK
    if _TRITON_OK is None:
        try:
            from trainer.algos import triton_kernels  # noqa: F401
        except Exception:  # ImportError, or a Triton without a usable backend
            _TRITON_OK = False
        else:
            _TRITON_OK = True
    return _TRITON_OK


_TRITON_OK: bool | None = None
_TRITON_CHECKED: dict[str, bool] = {}
KERNEL_BACKENDS = ("auto", "torch", "triton")
BACKEND_ENV = "STARE_KERNEL_BACKEND"  # overrides "auto": "torch" or "triton"


def triton_self_check(device: torch.device | str) -> bool:
    """Runs the fused kernel once on `device` against the chunked torch path (values and gradient, fp32
    and bf16 logits, T ≠ 1) and remembers the verdict per device. A kernel that fails to compile or
    disagrees is reported with a warning, and "auto" then keeps the torch path on that device."""
    key = str(torch.device(device))
    if key in _TRITON_CHECKED:
        return _TRITON_CHECKED[key]
    ok, reason = triton_available(), "the triton package does not import"
    if ok:
        try:
            from trainer.algos.triton_kernels import TritonLogProb

            gen = torch.Generator().manual_seed(0)
            for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 1e-2)):
                logits = (torch.randn((16, 3001), generator=gen) * 3).to(dtype).to(device)
                targets = torch.randint(0, 3001, (16,), generator=gen).to(device)
                g = torch.randn(16, generator=gen).to(device)
                results = []
                for fused in (True, False):
                    leaf = logits.detach().clone().requires_grad_(True)
                    flat = (leaf, targets, 0.7, True, True)
                    outs = (
                        TritonLogProb.apply(*flat, False)
                        if fused
                        else _ChunkedLogProb.apply(*flat[:3], 5, True, True, False)
                    )
                    (outs[0] * g).sum().backward()
                    assert leaf.grad is not None
                    results.append([t.detach().float() for t in (*outs, leaf.grad)])
                for name, got, want in zip(("log-prob", "entropy", "C", "gradient"), *results):
                    if not torch.allclose(got, want, rtol=tol, atol=tol):
                        raise AssertionError(f"{name} differs by {float((got - want).abs().max()):.3g}")
        except Exception as err:  # a compile error or a wrong result: keep the torch path
            ok, reason = False, f"{type(err).__name__}: {err}"
    if not ok:
        warnings.warn(
            f"fused Triton kernel unusable on {key} ({reason}); using the chunked torch kernel",
            RuntimeWarning,
            stacklevel=2,
        )
    _TRITON_CHECKED[key] = ok
    return ok


def resolve_backend(backend: str, logits: Tensor) -> str:
    """ "auto" picks the fused Triton kernel for CUDA logits when it passes its self-check on that device
    (`triton_self_check`), else the chunked torch path; STARE_KERNEL_BACKEND overrides "auto"."""
    if backend not in KERNEL_BACKENDS:
        raise ValueError(f"backend must be one of {KERNEL_BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = os.environ.get(BACKEND_ENV, "auto") or "auto"
        if backend not in KERNEL_BACKENDS:
            raise ValueError(f"{BACKEND_ENV} must be one of {KERNEL_BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if logits.is_cuda and triton_self_check(logits.device) else "torch"
    if backend == "triton" and not triton_available():
        raise ValueError("backend 'triton' needs the triton package (and a GPU, or TRITON_INTERPRET=1)")
    return backend


def token_stats_from_logits(
    logits: Tensor,
    target_ids: Tensor,
    *,
    temperature: float = 1.0,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    with_entropy: bool = True,
    with_correction: bool = True,
    backend: str = "auto",
    grad_in_logits: bool = False,
    entropy_grad: bool = False,
) -> TokenStats:
    """Scores `target_ids` (shape S) under `logits` (shape S + (V,)), any float dtype, in fp32.

    backend: "torch" = the chunked computation of this module (`chunk_rows` rows at a time; on CPU bit for
    bit the reference's values); "triton" = the fused kernel of `triton_kernels` (one row at a time on
    chip, no (rows, V) buffer; `chunk_rows` unused); "auto" = triton for CUDA logits when available.

    entropy_grad: the entropy comes back differentiable as well (for a loss with an entropy term), its
    gradient p (s − H)/T added chunk by chunk in backward; it runs the torch path without grad_in_logits.

    grad_in_logits: backward writes the logits' gradient over the logits themselves, chunk by chunk (row by
    row with "triton"), and passes that tensor on as their gradient: no (N, V) tensor is allocated in
    backward (the default allocates a fresh gradient as large as the logits). The values are the default
    path's, bit for bit, and the forward is unchanged. Meant for logits that are an intermediate nothing
    else reads afterwards, e.g. the LM head's output (its matmul's backward saves the head's inputs, not
    its output). The contract: the caller gives up the logits. After backward their memory (and that of
    any tensor sharing it, such as the tensor they were sliced from) holds the gradient, in their dtype;
    a leaf's `.grad` may then be the same memory as the leaf. Misuse fails loudly instead of reading the
    overwritten values: autograd's saved-tensor version check makes a second backward through this call
    (retain_graph=True), and the backward of any other op that saved the same logits and runs after this
    one (e.g. `logits.sin()`, `logits ** 2`), raise RuntimeError ("... modified by an inplace
    operation"); backward with create_graph=True raises too. When the logits cannot be viewed as (N, V)
    without a copy (`reshape` copies), or their elements overlap in memory (an `expand`ed tensor), or for
    "triton" their last dimension is strided, the kernel works on a contiguous copy made in forward and
    backward overwrites that copy instead; the logits are then left as they were.
    """
    _check_stats_arguments(
        logits, target_ids, temperature, chunk_rows, with_entropy, grad_in_logits, entropy_grad
    )
    if entropy_grad:
        # The entropy's gradient is built by the chunked torch backward into a fresh tensor.
        backend, grad_in_logits = "torch", False
    lead_shape = target_ids.shape
    flat_logits = logits.reshape(-1, logits.shape[-1])  # (N, V)
    if grad_in_logits and not _no_internal_overlap(flat_logits):
        flat_logits = flat_logits.contiguous()  # writing the gradient over shared elements would mix rows
    flat_targets = target_ids.reshape(-1).long()  # (N,)
    logprob, entropy, correction = _apply_kernel(
        resolve_backend(backend, logits), flat_logits, flat_targets, float(temperature), int(chunk_rows),
        with_entropy, with_correction, grad_in_logits, entropy_grad,
    )  # fmt: skip
    return TokenStats(
        logprob=logprob.view(lead_shape),
        entropy=entropy.view(lead_shape) if with_entropy else None,
        correction=correction.view(lead_shape) if with_correction else None,
    )


def _check_stats_arguments(
    logits: Tensor,
    target_ids: Tensor,
    temperature: float,
    chunk_rows: int,
    with_entropy: bool,
    grad_in_logits: bool,
    entropy_grad: bool,
) -> None:
    """`token_stats_from_logits` refuses what it cannot score: ValueError naming the argument."""
    _check_temperature(temperature)
    _check_chunk(chunk_rows)
    _check_flag("grad_in_logits", grad_in_logits)
    _check_flag("entropy_grad", entropy_grad)
    if entropy_grad and not with_entropy:
        raise ValueError("entropy_grad=True needs with_entropy=True")
    if logits.dim() < 1 or logits.shape[:-1] != target_ids.shape:
        raise ValueError(
            f"target_ids shape {tuple(target_ids.shape)} must equal logits shape without the vocabulary "
            f"dimension {tuple(logits.shape[:-1])}"
        )
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {logits.dtype}")


def _apply_kernel(
    backend: str,
    flat_logits: Tensor,
    flat_targets: Tensor,
    temperature: float,
    chunk_rows: int,
    with_entropy: bool,
    with_correction: bool,
    grad_in_logits: bool,
    entropy_grad: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(log-prob, entropy, C) of each row (N,) by the resolved backend's autograd function: the fused
    Triton kernel or the chunked torch one."""
    if backend == "triton":
        from trainer.algos.triton_kernels import TritonLogProb

        logprob, entropy, correction = TritonLogProb.apply(
            flat_logits, flat_targets, temperature, with_entropy, with_correction, grad_in_logits
        )
    else:
        logprob, entropy, correction = _ChunkedLogProb.apply(
            flat_logits, flat_targets, temperature, chunk_rows, with_entropy, with_correction,
            grad_in_logits, entropy_grad,
        )  # fmt: skip
    return logprob, entropy, correction


def token_stats_reference(logits: Tensor, target_ids: Tensor, *, temperature: float = 1.0) -> TokenStats:
    """The naive full-tensor computation, kept as the test and benchmark reference. Memory: O(N·V) fp32."""
    _check_temperature(temperature)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # (..., V)
    logprob = logp.gather(-1, target_ids.long().unsqueeze(-1)).squeeze(-1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)
    correction = (p * p * (-logp - entropy.unsqueeze(-1))).sum(-1)
    return TokenStats(logprob=logprob, entropy=entropy.detach(), correction=correction.detach())
