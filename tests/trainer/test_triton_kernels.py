"""The fused Triton kernel against the reference: values, gradient, options, bad input.

On a GPU the kernels run natively; without one they run through Triton's interpreter (TRITON_INTERPRET=1,
set by conftest.py before anything imports the kernels), so CI checks the same kernel code on CPU tensors.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from trainer.algos.kernels import (
    BACKEND_ENV,
    resolve_backend,
    token_stats_from_logits,
    token_stats_reference,
)
from trainer.algos.triton_kernels import MAX_BLOCK

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _case(rows: int, vocab: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn((rows, vocab), generator=gen) * 3.0).to(dtype)
    targets = torch.randint(0, vocab, (rows,), generator=gen)
    return logits, targets


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("vocab", [7, 1000, MAX_BLOCK + 905])  # one partial block; several blocks
def test_values_match_the_reference(dtype: torch.dtype, temperature: float, vocab: int) -> None:
    logits, targets = _case(6, vocab, dtype)
    ref = token_stats_reference(logits.float(), targets, temperature=temperature)
    got = token_stats_from_logits(
        logits.to(DEVICE), targets.to(DEVICE), temperature=temperature, backend="triton"
    )
    assert got.entropy is not None and got.correction is not None
    assert ref.entropy is not None and ref.correction is not None
    torch.testing.assert_close(got.logprob.cpu(), ref.logprob, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(got.entropy.cpu(), ref.entropy, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(got.correction.cpu(), ref.correction, rtol=1e-4, atol=2e-5)
    assert (got.correction <= 1e-6).all()  # C(p) ≤ 0 (ALGORITHMS.md §7)
    assert got.logprob.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradient_matches_autograd_of_the_reference(dtype: torch.dtype) -> None:
    logits, targets = _case(5, 1000, dtype, seed=1)
    g = torch.randn(5)
    leaf = logits.to(DEVICE).requires_grad_(True)
    got = token_stats_from_logits(leaf, targets.to(DEVICE), temperature=0.8, backend="triton")
    (got.logprob * g.to(DEVICE)).sum().backward()
    ref_leaf = logits.detach().float().clone().requires_grad_(True)
    (token_stats_reference(ref_leaf, targets, temperature=0.8).logprob * g).sum().backward()
    assert leaf.grad is not None and ref_leaf.grad is not None
    assert leaf.grad.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 8e-3  # bf16: the gradient is stored in bf16
    torch.testing.assert_close(leaf.grad.float().cpu(), ref_leaf.grad, rtol=tol, atol=tol)


def test_entropy_and_correction_carry_no_gradient_and_can_be_skipped() -> None:
    logits, targets = _case(4, 300, torch.float32, seed=2)
    leaf = logits.to(DEVICE).requires_grad_(True)
    got = token_stats_from_logits(leaf, targets.to(DEVICE), backend="triton")
    assert got.logprob.requires_grad
    assert got.entropy is not None and not got.entropy.requires_grad
    assert got.correction is not None and not got.correction.requires_grad
    lean = token_stats_from_logits(
        leaf, targets.to(DEVICE), backend="triton", with_entropy=False, with_correction=False
    )
    assert lean.entropy is None and lean.correction is None
    torch.testing.assert_close(lean.logprob, got.logprob, rtol=0, atol=0)
    only_h = token_stats_from_logits(leaf, targets.to(DEVICE), backend="triton", with_correction=False)
    assert only_h.correction is None and only_h.entropy is not None
    torch.testing.assert_close(only_h.entropy, got.entropy, rtol=0, atol=0)


def test_batch_shapes_and_strided_logits_agree_with_the_torch_backend() -> None:
    gen = torch.Generator().manual_seed(3)
    full = torch.randn((3, 8, 50), generator=gen) * 2
    logits = full[:, ::2, :].to(DEVICE)  # (3, 4, 50), rows not contiguous
    targets = torch.randint(0, 50, (3, 4), generator=gen).to(DEVICE)
    fused = token_stats_from_logits(logits, targets, backend="triton")
    chunked = token_stats_from_logits(logits, targets, backend="torch")
    assert fused.logprob.shape == (3, 4)
    assert fused.entropy is not None and chunked.entropy is not None
    torch.testing.assert_close(fused.logprob, chunked.logprob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused.entropy, chunked.entropy, rtol=1e-5, atol=1e-5)
    empty = token_stats_from_logits(logits[:, :0], targets[:, :0], backend="triton")
    assert empty.logprob.shape == (3, 0)


def test_a_target_outside_the_vocabulary_gives_nan_not_a_stray_read() -> None:
    logits, _ = _case(2, 40, torch.float32, seed=4)
    got = token_stats_from_logits(logits.to(DEVICE), torch.tensor([3, 40], device=DEVICE), backend="triton")
    assert torch.isfinite(got.logprob[0]) and torch.isnan(got.logprob[1])


def test_backend_choice_and_bad_names(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_logits = torch.zeros(2, 3)
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert resolve_backend("auto", cpu_logits) == "torch"  # CPU logits: the chunked path
    assert resolve_backend("triton", cpu_logits) == "triton"
    with pytest.raises(ValueError, match="backend"):
        resolve_backend("cuda", cpu_logits)
    with pytest.raises(ValueError, match="backend"):
        token_stats_from_logits(cpu_logits, torch.zeros(2, dtype=torch.long), backend="fast")
    monkeypatch.setenv(BACKEND_ENV, "triton")
    assert resolve_backend("auto", cpu_logits) == "triton"
    assert resolve_backend("torch", cpu_logits) == "torch"  # an explicit choice wins
    monkeypatch.setenv(BACKEND_ENV, "bogus")
    with pytest.raises(ValueError, match=BACKEND_ENV):
        resolve_backend("auto", cpu_logits)
    if torch.cuda.is_available():
        monkeypatch.delenv(BACKEND_ENV)
        assert resolve_backend("auto", cpu_logits.cuda()) == "triton"


def test_self_check_accepts_the_kernel_and_rejects_a_broken_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.algos import kernels, triton_kernels

    monkeypatch.setattr(kernels, "_TRITON_CHECKED", {})
    assert kernels.triton_self_check(DEVICE) is True
    assert {str(DEVICE): True} == kernels._TRITON_CHECKED  # remembered per device

    real_apply = triton_kernels.TritonLogProb.apply

    def off_by_a_little(*args):  # a kernel that compiles but computes the wrong entropy
        logprob, entropy, correction = real_apply(*args)
        return logprob, entropy + 1e-2, correction

    monkeypatch.setattr(kernels, "_TRITON_CHECKED", {})
    monkeypatch.setattr(triton_kernels.TritonLogProb, "apply", off_by_a_little)
    with pytest.warns(RuntimeWarning, match="entropy differs"):
        assert kernels.triton_self_check(DEVICE) is False

    def does_not_compile(*args):
        raise RuntimeError("PTX assembly failed")

    monkeypatch.setattr(kernels, "_TRITON_CHECKED", {})
    monkeypatch.setattr(triton_kernels.TritonLogProb, "apply", does_not_compile)
    with pytest.warns(RuntimeWarning, match="PTX assembly failed"):
        assert kernels.triton_self_check(DEVICE) is False
    if torch.cuda.is_available():  # "auto" then keeps the chunked path on that device
        monkeypatch.delenv(BACKEND_ENV, raising=False)
        assert resolve_backend("auto", torch.zeros(1, 2, device=DEVICE)) == "torch"
