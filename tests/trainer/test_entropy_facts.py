"""ALGORITHMS.md §1 and §7.1–7.4: the first-order entropy dynamics, checked against autograd and against
entropy changes measured by actually taking the step (float64 measurements)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.testing import assert_close

from trainer.algos import (
    entropy_sensitivity,
    quadrant_analysis,
    token_stats_from_logits,
    token_stats_reference,
)

# A top token (index 0: s < H) and a tail token (index 5: s > H) for which the quadrant table holds.
QUADRANT_LOGITS = [3.0, 1.0, 0.5, 0.0, -1.0, -2.0]
TOP, TAIL = 0, 5


def entropy_f64(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits.double(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def entropy_logit_gradient(logits: torch.Tensor) -> torch.Tensor:
    """Closed-form dH/dz = p (s − H) along the last dimension, fp32 (the formula of fact 1)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1, keepdim=True)
    return p * (-logp - entropy)


def random_logits(shape: tuple[int, ...], seed: int, scale: float = 2.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64) * scale


def all_token_stats(logits_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(p_a, Φ_a, C) for every token a of one vocabulary row, via the chunked kernel."""
    vocab = logits_row.shape[-1]
    stats = token_stats_from_logits(logits_row.expand(vocab, vocab), torch.arange(vocab), chunk_rows=3)
    assert stats.entropy is not None and stats.correction is not None
    phi = entropy_sensitivity(stats.logprob, stats.entropy, stats.correction).double()  # (V,)
    return stats.logprob.double().exp(), phi, stats.correction.double()


def policy_gradient_step(logits: torch.Tensor, token: int, advantage: float, eta: float) -> torch.Tensor:
    """z + η Â (e_a − p), float64."""
    z = logits.double()
    one_hot = torch.zeros_like(z)
    one_hot[token] = 1.0
    return z + eta * advantage * (one_hot - torch.softmax(z, dim=-1))


# ------------------------------------------------------------------------------------------- fact 1


@pytest.mark.parametrize("shape", [(2,), (7,), (3, 50), (2, 4, 11)])
@pytest.mark.parametrize("scale", [0.5, 3.0])
def test_closed_form_entropy_gradient_matches_autograd(shape: tuple[int, ...], scale: float) -> None:
    logits = random_logits(shape, seed=sum(shape), scale=scale).requires_grad_(True)
    (autograd,) = torch.autograd.grad(entropy_f64(logits).sum(), logits)  # float64
    closed_form = entropy_logit_gradient(logits.detach())

    assert_close(closed_form.double(), autograd, atol=1e-6, rtol=0.0)
    assert_close(
        closed_form.sum(-1).double(), torch.zeros(shape[:-1], dtype=torch.float64), atol=1e-6, rtol=0
    )


# ------------------------------------------------------------------------------------------- fact 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_selected_logit_bump_changes_entropy_by_p_times_surprisal_minus_entropy(seed: int) -> None:
    logits = random_logits((9,), seed=seed)
    stats = token_stats_reference(logits.expand(9, 9), torch.arange(9))
    assert stats.entropy is not None
    p_a = stats.logprob.double().exp()
    s_a = -stats.logprob.double()
    expected = p_a * (s_a - stats.entropy.double())  # (V,) one value per selected token a

    closed_form = entropy_logit_gradient(logits)
    assert_close(closed_form.double(), expected, atol=1e-6, rtol=0.0)

    # Central finite difference of H along e_a, measured in float64.
    delta = 1e-5
    eye = torch.eye(9, dtype=torch.float64)
    measured = (entropy_f64(logits + delta * eye) - entropy_f64(logits - delta * eye)) / (2 * delta)
    assert_close(measured, expected, atol=1e-6, rtol=0.0)
    # The sign of the bump's effect is sign(s − H).
    assert torch.equal(torch.sign(measured), torch.sign(s_a - stats.entropy.double()))


# ------------------------------------------------------------------------------------------- fact 3


@pytest.mark.parametrize(
    ("logits", "token"),
    [
        (QUADRANT_LOGITS, TOP),
        (QUADRANT_LOGITS, TAIL),
        (random_logits((12,), seed=3).tolist(), 4),
        (random_logits((12,), seed=4, scale=0.3).tolist(), 0),
    ],
)
@pytest.mark.parametrize("advantage", [1.0, -1.0, 0.37])
def test_one_step_entropy_change_converges_to_advantage_times_phi(
    logits: list[float], token: int, advantage: float
) -> None:
    z = torch.tensor(logits, dtype=torch.float64)
    _, phi, _ = all_token_stats(z)
    predicted = advantage * phi[token].item()

    errors = []
    for eta in (1e-1, 1e-2, 1e-3):
        measured = (entropy_f64(policy_gradient_step(z, token, advantage, eta)) - entropy_f64(z)) / eta
        errors.append(abs(measured.item() - predicted))
    # First-order convergence: the error shrinks about tenfold per decade of η.
    for coarse, fine in itertools.pairwise(errors):
        assert 5.0 < coarse / fine < 20.0, errors
    assert errors[-1] < 1e-4 * max(1.0, abs(predicted))


@pytest.mark.parametrize("vocab", [2, 5, 40])
@pytest.mark.parametrize("scale", [0.1, 1.0, 6.0])
def test_phi_has_zero_mean_under_the_policy_and_correction_is_non_positive(vocab: int, scale: float) -> None:
    z = random_logits((vocab,), seed=vocab, scale=scale)
    p, phi, correction = all_token_stats(z)

    assert_close((p * phi).sum(), torch.tensor(0.0, dtype=torch.float64), atol=1e-6, rtol=0.0)
    assert (correction <= 1e-7).all()
    assert correction.max() < -1e-6  # non-uniform p: strictly negative


def test_correction_is_zero_for_a_uniform_policy_and_negative_for_peaked_ones() -> None:
    logits = torch.stack([torch.zeros(16), torch.linspace(-8.0, 8.0, 16), torch.linspace(-0.5, 0.5, 16)])
    stats = token_stats_from_logits(logits, torch.zeros(3, dtype=torch.long))
    assert stats.correction is not None
    assert abs(stats.correction[0].item()) < 1e-6
    assert (stats.correction[1:] < 0).all()


# ------------------------------------------------------------------------------------------- fact 4

# (advantage, token, expected sign of ΔH, quadrant): STARE's Fig. 2 table.
QUADRANT_TABLE = [
    (1.0, TOP, -1.0, "pos_low"),
    (1.0, TAIL, 1.0, "pos_high"),
    (-1.0, TOP, 1.0, "neg_low"),
    (-1.0, TAIL, -1.0, "neg_high"),
]


@pytest.mark.parametrize(("advantage", "token", "entropy_sign", "quadrant"), QUADRANT_TABLE)
def test_quadrant_sign_table_holds_when_the_step_is_taken(
    advantage: float, token: int, entropy_sign: float, quadrant: str
) -> None:
    z = torch.tensor(QUADRANT_LOGITS, dtype=torch.float64)
    delta_entropy = entropy_f64(policy_gradient_step(z, token, advantage, eta=0.05)) - entropy_f64(z)
    assert torch.sign(delta_entropy).item() == entropy_sign

    stats = token_stats_from_logits(z.view(1, 1, -1), torch.tensor([[token]]))
    assert stats.entropy is not None and stats.correction is not None
    metrics = quadrant_analysis(
        torch.tensor([advantage]), stats.logprob, stats.entropy, stats.correction, torch.ones(1, 1)
    )
    for name in ("pos_low", "pos_high", "neg_low", "neg_high"):
        assert metrics[f"quadrant/{name}_fraction"].item() == (1.0 if name == quadrant else 0.0)
    assert torch.sign(metrics[f"quadrant/{quadrant}_drift"]).item() == entropy_sign
    # The predicted drift is the first-order change per unit step: close to the measured one at η = 0.05.
    assert_close(metrics["quadrant/predicted_drift"].double(), delta_entropy / 0.05, atol=0.02, rtol=0.1)


def test_quadrant_analysis_pools_tokens_and_normalises_drift_by_the_step_token_count() -> None:
    z = torch.tensor(QUADRANT_LOGITS)
    # Row 0: Â = +1 on [top, tail, pad]; row 1: Â = −1 on [top, tail, tail]; row 2: Â = 0 on [top, pad, pad].
    targets = torch.tensor([[TOP, TAIL, TOP], [TOP, TAIL, TAIL], [TOP, TOP, TOP]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    advantages = torch.tensor([1.0, -1.0, 0.0])
    stats = token_stats_from_logits(z.expand(3, 3, -1), targets)
    assert stats.entropy is not None and stats.correction is not None
    _, phi, _ = all_token_stats(z.double())

    metrics = quadrant_analysis(advantages, stats.logprob, stats.entropy, stats.correction, mask)
    assert_close(metrics["quadrant/pos_low_fraction"], torch.tensor(1 / 6))
    assert_close(metrics["quadrant/pos_high_fraction"], torch.tensor(1 / 6))
    assert_close(metrics["quadrant/neg_low_fraction"], torch.tensor(1 / 6))
    assert_close(metrics["quadrant/neg_high_fraction"], torch.tensor(2 / 6))
    expected_drift = {
        "pos_low": phi[TOP] / 6,
        "pos_high": phi[TAIL] / 6,
        "neg_low": -phi[TOP] / 6,
        "neg_high": -2 * phi[TAIL] / 6,
    }
    for name, value in expected_drift.items():
        assert_close(metrics[f"quadrant/{name}_drift"].double(), value, atol=1e-6, rtol=1e-5)
    assert_close(
        metrics["quadrant/predicted_drift"].double(),
        sum(expected_drift.values(), torch.tensor(0.0, dtype=torch.float64)),
        atol=1e-6,
        rtol=1e-5,
    )

    # With a step-wide count of 12 active tokens the drift halves; fractions stay local.
    wider = quadrant_analysis(
        advantages, stats.logprob, stats.entropy, stats.correction, mask, global_token_count=12
    )
    assert_close(wider["quadrant/neg_high_drift"], metrics["quadrant/neg_high_drift"] / 2)
    assert_close(wider["quadrant/neg_high_fraction"], metrics["quadrant/neg_high_fraction"])
