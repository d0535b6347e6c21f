"""`token_stats_from_logits(..., grad_in_logits=True)`: backward writes the gradient over the logits.

The gradient and the forward values must be the default path's bit for bit (same operations, same order);
the gradient returned must be the logits' own memory, with no (N, V) tensor allocated in backward; misuse
(a second backward, another op that saved the same logits) must raise instead of reading overwritten
values. Each test runs the chunked torch path and, where Triton is installed, the fused Triton kernel
(through its interpreter on CPU: conftest.py sets TRITON_INTERPRET=1).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.algos import token_stats_from_logits

HAS_TRITON = importlib.util.find_spec("triton") is not None
BACKENDS = [
    "torch",
    pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="triton not installed")),
]
DTYPES = [torch.float32, torch.bfloat16]
TEMPERATURES = [1.0, 0.7]
# (rows, chunk rows): chunks that do not divide N, that divide it, and N smaller than one chunk.
ROWS_AND_CHUNKS = [(21, 5), (20, 5), (3, 8)]
VOCAB = 37


def make_case(rows: int, vocab: int, dtype: torch.dtype, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn((rows, vocab), generator=gen) * 3.0).to(dtype)
    targets = torch.randint(0, vocab, (rows,), generator=gen)
    upstream = torch.randn(rows, generator=gen)
    return logits, targets, upstream


def stats_and_grad(
    logits: Tensor, targets: Tensor, upstream: Tensor, grad_in_logits: bool, **kwargs: Any
) -> tuple[list[Tensor], Tensor]:
    """The forward's three outputs and ∂(Σ g·log p_a)/∂logits, for a fresh leaf copy of `logits`."""
    leaf = logits.detach().clone().requires_grad_(True)
    stats = token_stats_from_logits(leaf, targets, grad_in_logits=grad_in_logits, **kwargs)
    assert stats.entropy is not None and stats.correction is not None
    values = [stats.logprob.detach().clone(), stats.entropy, stats.correction]
    (grad,) = torch.autograd.grad((stats.logprob * upstream).sum(), leaf)
    if grad_in_logits:
        assert grad.data_ptr() == leaf.data_ptr()  # the logits' own memory: nothing new allocated
        assert grad.shape == leaf.shape and grad.stride() == leaf.stride()
        assert torch.equal(leaf.detach(), grad)  # the logits now hold the gradient
    return values, grad


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize(("rows", "chunk_rows"), ROWS_AND_CHUNKS)
def test_gradient_and_values_equal_the_default_path_bit_for_bit(
    backend: str, dtype: torch.dtype, temperature: float, rows: int, chunk_rows: int
) -> None:
    if backend == "triton" and chunk_rows != 5:
        pytest.skip("the Triton kernel has no chunks")
    logits, targets, upstream = make_case(rows, VOCAB, dtype)
    kwargs: dict[str, Any] = {"temperature": temperature, "chunk_rows": chunk_rows, "backend": backend}
    values, grad = stats_and_grad(logits, targets, upstream, False, **kwargs)
    values_in, grad_in = stats_and_grad(logits, targets, upstream, True, **kwargs)
    assert grad_in.dtype == dtype
    assert torch.equal(grad_in, grad)
    for got, want in zip(values_in, values, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_several_triton_blocks_and_leading_dimensions(backend: str, dtype: torch.dtype) -> None:
    # V = 5,001: the Triton kernel's row loop takes two blocks (MAX_BLOCK = 4,096); (2, 3) lead shape.
    logits, targets, upstream = make_case(6, 5001, dtype, seed=3)
    shaped = logits.view(2, 3, -1)
    kwargs: dict[str, Any] = {"temperature": 0.7, "chunk_rows": 4, "backend": backend}
    values, grad = stats_and_grad(shaped, targets.view(2, 3), upstream.view(2, 3), False, **kwargs)
    values_in, grad_in = stats_and_grad(shaped, targets.view(2, 3), upstream.view(2, 3), True, **kwargs)
    assert grad_in.shape == (2, 3, 5001)
    assert torch.equal(grad_in, grad)
    for got, want in zip(values_in, values, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_gradient_flows_on_through_a_linear_head(
    backend: str, dtype: torch.dtype, temperature: float
) -> None:
    """The intended use: logits = hidden @ W.T + b, an intermediate nobody else reads. hidden, W and b get
    the default path's gradients exactly, and the matmul's backward reads the logits' memory."""
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(19, 8, generator=gen).to(dtype)
    weight = (torch.randn(VOCAB, 8, generator=gen) * 0.7).to(dtype)
    bias = torch.randn(VOCAB, generator=gen).to(dtype)
    targets = torch.randint(0, VOCAB, (19,), generator=gen)
    upstream = torch.randn(19, generator=gen)
    results = []
    for grad_in_logits in (False, True):
        leaves = [t.detach().clone().requires_grad_(True) for t in (hidden, weight, bias)]
        logits = F.linear(*leaves)
        seen: list[Tensor] = []
        logits.register_hook(seen.append)
        stats = token_stats_from_logits(
            logits,
            targets,
            temperature=temperature,
            chunk_rows=4,
            backend=backend,
            grad_in_logits=grad_in_logits,
        )
        (stats.logprob * upstream).sum().backward()
        (grad_logits,) = seen
        assert (grad_logits.data_ptr() == logits.data_ptr()) is grad_in_logits
        results.append([leaf.grad for leaf in leaves])
    for got, want in zip(results[1], results[0], strict=True):
        assert got is not None and want is not None
        assert torch.equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_viewed_without_a_copy_are_overwritten_in_place(backend: str) -> None:
    # Every other row of a larger tensor: (N, V) is a strided view, written in place; the rows between
    # are not touched.
    logits, targets, upstream = make_case(16, VOCAB, torch.float32, seed=5)
    default_full = logits.clone().requires_grad_(True)
    stats = token_stats_from_logits(default_full[::2], targets[::2], chunk_rows=3, backend=backend)
    (want,) = torch.autograd.grad((stats.logprob * upstream[::2]).sum(), default_full)

    full = logits.clone().requires_grad_(True)
    seen: list[Tensor] = []
    rows = full[::2]
    rows.register_hook(seen.append)
    stats = token_stats_from_logits(rows, targets[::2], chunk_rows=3, backend=backend, grad_in_logits=True)
    (got,) = torch.autograd.grad((stats.logprob * upstream[::2]).sum(), full)
    assert torch.equal(got, want)
    assert seen[0].data_ptr() == full.data_ptr()
    assert torch.equal(full.detach()[::2], want[::2])  # the viewed rows hold their gradient
    assert torch.equal(full.detach()[1::2], logits[1::2])  # the others are as they were


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_that_need_a_copy_leave_the_original_untouched(backend: str) -> None:
    # The usual next-token slice (reshape copies it) and an expanded row (its elements share memory):
    # the kernel overwrites its own copy; the caller's tensor keeps its values and its gradient is right.
    logits, targets, upstream = make_case(12, VOCAB, torch.float32, seed=6)
    cases = [
        (lambda x: x.view(2, 6, VOCAB)[:, :-1], logits, targets[:10].view(2, 5), upstream[:10].view(2, 5)),
        (lambda x: x.expand(7, VOCAB), logits[0], targets[:7], upstream[:7]),
    ]
    for select, source, tgt, g in cases:
        grads = []
        for grad_in_logits in (False, True):
            leaf = source.clone().requires_grad_(True)
            stats = token_stats_from_logits(
                select(leaf), tgt, chunk_rows=3, backend=backend, grad_in_logits=grad_in_logits
            )
            grads.append(torch.autograd.grad((stats.logprob * g).sum(), leaf)[0])
            assert torch.equal(leaf.detach(), source)
        assert torch.equal(grads[1], grads[0])


# ---------------------------------------------------------------------------------- no allocation


class _RecordOps(TorchDispatchMode):
    """Every aten op run while active: its name, the largest tensor it returns (elements), and whether an
    `out=` tensor overlaps the memory of one of its tensor inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.largest: list[tuple[str, int, bool]] = []
        self.aliased_out: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = kwargs.get("out")
        if isinstance(out, Tensor):
            for arg in args:
                if isinstance(arg, Tensor) and _overlaps(arg, out):
                    self.aliased_out.append(str(func))
        result = func(*args, **kwargs)
        tensors = [
            t for t in (result if isinstance(result, tuple | list) else [result]) if isinstance(t, Tensor)
        ]
        for t in tensors:
            fresh = not any(isinstance(a, Tensor) and _same_storage(a, t) for a in (*args, *kwargs.values()))
            self.largest.append((str(func), t.numel(), fresh))
        return result

    def largest_fresh(self) -> int:
        return max((numel for _, numel, fresh in self.largest if fresh), default=0)


def _same_storage(a: Tensor, b: Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _overlaps(a: Tensor, b: Tensor) -> bool:
    """Whether the byte ranges spanned by a and b intersect (a conservative test for shared elements)."""
    if not _same_storage(a, b) or a.numel() == 0 or b.numel() == 0:
        return False

    def span(t: Tensor) -> tuple[int, int]:
        start = t.storage_offset() * t.element_size()
        last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
        return start, start + (last + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_backward_allocates_nothing_of_the_logits_size(
    backend: str, dtype: torch.dtype, temperature: float
) -> None:
    rows, chunk_rows = 21, 5
    logits, targets, upstream = make_case(rows, VOCAB, dtype, seed=7)
    largest = {}
    for grad_in_logits in (False, True):
        leaf = logits.clone().requires_grad_(True)
        stats = token_stats_from_logits(
            leaf,
            targets,
            temperature=temperature,
            chunk_rows=chunk_rows,
            backend=backend,
            grad_in_logits=grad_in_logits,
        )
        loss = (stats.logprob * upstream).sum()
        with _RecordOps() as record:
            torch.autograd.grad(loss, leaf)
        assert record.aliased_out == [], "an out= argument overlaps an input"
        largest[grad_in_logits] = record.largest_fresh()
    assert largest[False] == rows * VOCAB  # the detector sees the default path's fresh gradient
    # In place: at most the (chunk_rows, V) work buffers (none at all for Triton).
    assert largest[True] <= chunk_rows * VOCAB
    if backend == "triton":
        assert largest[True] < VOCAB


# ---------------------------------------------------------------------------------- misuse is loud


@pytest.mark.parametrize("backend", BACKENDS)
def test_another_op_that_saved_the_logits_fails_loudly(backend: str) -> None:
    logits, targets, upstream = make_case(9, VOCAB, torch.float32, seed=8)
    leaf = logits.clone().requires_grad_(True)
    # `** 2` saves its input for backward. It is recorded before the kernel, so autograd runs its backward
    # after the kernel's, when the logits already hold the gradient.
    squares = (leaf**2).sum()
    stats = token_stats_from_logits(leaf, targets, chunk_rows=4, backend=backend, grad_in_logits=True)
    loss = squares + (stats.logprob * upstream).sum()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_second_backward_fails_loudly(backend: str, dtype: torch.dtype) -> None:
    logits, targets, upstream = make_case(9, VOCAB, dtype, seed=9)
    leaf = logits.clone().requires_grad_(True)
    stats = token_stats_from_logits(
        leaf, targets, temperature=0.7, chunk_rows=4, backend=backend, grad_in_logits=True
    )
    loss = (stats.logprob * upstream).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    # The default path keeps the logits and can go again.
    leaf = logits.clone().requires_grad_(True)
    stats = token_stats_from_logits(leaf, targets, temperature=0.7, chunk_rows=4, backend=backend)
    loss = (stats.logprob * upstream).sum()
    loss.backward(retain_graph=True)
    loss.backward()


@pytest.mark.parametrize("backend", BACKENDS)
def test_create_graph_is_refused(backend: str) -> None:
    logits, targets, _ = make_case(4, VOCAB, torch.float32, seed=10)
    leaf = logits.clone().requires_grad_(True)
    stats = token_stats_from_logits(leaf, targets, backend=backend, grad_in_logits=True)
    with pytest.raises(RuntimeError, match="create_graph"):
        torch.autograd.grad(stats.logprob.sum(), leaf, create_graph=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_leaf_gets_its_own_memory_as_grad(backend: str) -> None:
    # AccumulateGrad takes the returned tensor as `.grad` without a copy: no (N, V) allocation there either.
    logits, targets, upstream = make_case(2 * 3, VOCAB, torch.bfloat16, seed=12)
    leaf = logits.view(2, 3, VOCAB).clone().requires_grad_(True)
    stats = token_stats_from_logits(
        leaf, targets.view(2, 3), chunk_rows=4, backend=backend, grad_in_logits=True
    )
    (stats.logprob * upstream.view(2, 3)).sum().backward()
    assert leaf.grad is not None and leaf.grad.data_ptr() == leaf.data_ptr()
    assert torch.equal(leaf.grad, leaf.detach())


def test_without_backward_the_logits_are_kept() -> None:
    logits, targets, _ = make_case(7, VOCAB, torch.float32, seed=11)
    before = logits.clone()
    token_stats_from_logits(logits, targets, chunk_rows=3, grad_in_logits=True)
    assert torch.equal(logits, before)


@pytest.mark.parametrize("value", [1, 0, "yes", None, 1.0])
def test_grad_in_logits_must_be_a_bool(value: Any) -> None:
    with pytest.raises(ValueError, match="grad_in_logits must be a bool"):
        token_stats_from_logits(torch.zeros(2, 5), torch.zeros(2, dtype=torch.long), grad_in_logits=value)
