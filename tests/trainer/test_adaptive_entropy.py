"""The adaptive entropy bonus (Skywork-OR1's adaptive entropy control), the baseline nearest to STARE's gate.

Controller, per step from H̄ against H_tgt: α = c·1[H̄ < H_tgt]; c ← clip(c + Δ·sgn(H_tgt − H̄), 0, c_max).
Loss: the grpo_ds per-token loss − α·H_t, token-mean; its gradient adds −α·∂H/∂z = −α·p(s − H)/T.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.testing import assert_close

from contract.control.entropy_coef import EntropyCoefState, initial_state, update_coef
from contract.hyperparams import AdaptiveEntropyParams
from contract.spec import TrainSpec
from trainer.algos import PolicyLossInputs, compute_policy_loss, make_loss_params, token_stats_from_logits
from trainer.algos.losses import zero_advantage_rows_inert
from trainer.engine import Engine, ExitCode

from .test_engine import read_events, small_spec

PARAMS = AdaptiveEntropyParams(coef_init=0.0, coef_step=0.005, coef_max=0.02)


def test_the_coefficient_rises_by_delta_below_target_and_acts_only_there() -> None:
    state = initial_state(None, PARAMS)
    applied = []
    for _ in range(6):  # below target: α uses c before the step, then c += Δ up to c_max
        state = update_coef(state, 0.1, 0.3, PARAMS)
        applied.append(state.applied)
    assert applied == pytest.approx([0.0, 0.005, 0.010, 0.015, 0.020, 0.020])
    assert state.coef == pytest.approx(0.02)
    above = update_coef(state, 0.5, 0.3, PARAMS)  # above target: no bonus this step, c falls by Δ
    assert above.applied == 0.0
    assert above.coef == pytest.approx(0.015)
    at = update_coef(above, 0.3, 0.3, PARAMS)  # at the target: no bonus (strict), c unchanged (sgn 0)
    assert at.applied == 0.0
    assert at.coef == pytest.approx(0.015)
    assert at.updates == 8


def test_the_coefficient_never_goes_below_zero() -> None:
    state = EntropyCoefState(coef=0.003)
    for _ in range(3):
        state = update_coef(state, 1.0, 0.3, PARAMS)
    assert state.coef == 0.0
    assert state.applied == 0.0


@pytest.mark.parametrize("entropy", [math.nan, math.inf, -math.inf])
def test_a_non_finite_measurement_leaves_the_state_unchanged(entropy: float) -> None:
    state = EntropyCoefState(coef=0.01, applied=0.01, batch_entropy=0.2, updates=4)
    assert update_coef(state, entropy, 0.3, PARAMS) == state


def test_state_round_trips_through_a_dict() -> None:
    state = EntropyCoefState(coef=0.01, applied=0.005, batch_entropy=0.2, updates=4)
    assert EntropyCoefState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


@pytest.mark.parametrize(
    "bad", [{"coef_step": -0.1}, {"coef_max": math.inf}, {"coef_init": 0.5, "coef_max": 0.1}, {"coef": -1.0}]
)
def test_bad_parameters_are_refused_naming_them(bad: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        make_loss_params("adaptive_entropy", **bad)


def test_the_spec_refuses_the_controlled_coefficient() -> None:
    with pytest.raises(ValueError, match=r"algorithm\.params\.coef"):
        TrainSpec.model_validate(small_spec(algorithm={"name": "adaptive_entropy", "params": {"coef": 0.1}}))


def _case(temperature: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 4, 11, generator=g) * 2
    targets = torch.randint(11, (3, 4), generator=g)
    batch = {
        "advantages": torch.tensor([1.0, -0.5, 0.0]),
        "response_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]),
        "old_logprob": torch.log_softmax(logits / temperature, -1).gather(-1, targets[..., None]).squeeze(-1)
        + 0.05 * torch.randn(3, 4, generator=g),
    }
    return logits, targets, batch


def _loss_grad(
    name: str, logits: torch.Tensor, targets: torch.Tensor, batch: dict, t: float, coef: float | None = None
):
    """coef: the controller's α this step, handed to the loss as its control argument."""
    leaf = logits.clone().requires_grad_(True)
    stats = token_stats_from_logits(leaf, targets, temperature=t, entropy_grad=name == "adaptive_entropy")
    inputs = PolicyLossInputs(logprob=stats.logprob, entropy=stats.entropy, **batch)
    control = EntropyCoefState(coef=coef, applied=coef) if coef is not None else None
    loss, metrics = compute_policy_loss(name, inputs, make_loss_params(name), control=control)
    loss.backward()
    return loss.detach(), leaf.grad, metrics


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_gradient_is_grpo_ds_minus_alpha_times_the_closed_form_entropy_gradient(
    temperature: float,
) -> None:
    logits, targets, batch = _case(temperature)
    alpha = 0.05
    base_loss, base_grad, _ = _loss_grad("grpo_ds", logits, targets, batch, temperature)
    loss, grad, metrics = _loss_grad("adaptive_entropy", logits, targets, batch, temperature, coef=alpha)
    mask = batch["response_mask"].float()
    z = logits / temperature
    logp = torch.log_softmax(z, -1)
    p = logp.exp()
    h = -(p * logp).sum(-1)
    # ALGORITHMS §1: dH/dz_k = p_k (s_k − H); through z = logits / T a factor 1/T.
    dh = p * (-logp - h[..., None]) / temperature
    expected = base_grad - alpha * dh * (mask / mask.sum())[..., None]
    assert_close(grad, expected, atol=1e-6, rtol=1e-5)
    assert_close(loss, base_loss - alpha * (h * mask).sum() / mask.sum(), atol=1e-6, rtol=1e-5)
    assert float(metrics["entropy_bonus/coef"]) == pytest.approx(alpha)


def test_with_coefficient_zero_the_loss_and_gradient_are_grpo_ds_bit_for_bit() -> None:
    logits, targets, batch = _case(1.0, seed=1)
    base_loss, base_grad, _ = _loss_grad("grpo_ds", logits, targets, batch, 1.0)
    loss, grad, _ = _loss_grad("adaptive_entropy", logits, targets, batch, 1.0, coef=0.0)
    assert torch.equal(loss, base_loss)
    assert torch.equal(grad, base_grad)


def test_rows_with_zero_advantage_get_the_bonus_gradient_so_they_are_not_skipped() -> None:
    logits, targets, batch = _case(1.0, seed=2)
    _, grad, _ = _loss_grad("adaptive_entropy", logits, targets, batch, 1.0, coef=0.1)
    assert grad[2, :2].abs().sum() > 0  # row 2 has Â = 0
    assert not zero_advantage_rows_inert("adaptive_entropy", make_loss_params("adaptive_entropy"))


def test_a_non_differentiable_entropy_is_refused_when_the_bonus_acts() -> None:
    logits, targets, batch = _case(1.0)
    leaf = logits.clone().requires_grad_(True)
    stats = token_stats_from_logits(leaf, targets)
    inputs = PolicyLossInputs(logprob=stats.logprob, entropy=stats.entropy, **batch)
    with pytest.raises(ValueError, match="differentiable entropy"):
        compute_policy_loss("adaptive_entropy", inputs, control=EntropyCoefState(coef=0.1, applied=0.1))


def test_the_engine_applies_the_coefficient_from_its_controller(tmp_path) -> None:
    # The tiny random model's entropy (≈ 3 nats) is below a target of 5: the bonus acts from step 2 on,
    # with α growing by Δ each step; above a target of 0.1 it never acts.
    below = small_spec(
        algorithm={"name": "adaptive_entropy", "params": {"coef_step": 0.01}, "gate": {"target_entropy": 5.0}}
    )
    assert Engine(TrainSpec.model_validate(below), tmp_path / "below").run() == ExitCode.OK
    steps = [e["metrics"] for e in read_events(tmp_path / "below") if e["type"] == "step"]
    assert [s["entropy_bonus/coef"] for s in steps] == pytest.approx([0.0, 0.01, 0.02, 0.03])
    assert all(s["entropy/mean"] < 5.0 for s in steps)
    above = small_spec(algorithm={"name": "adaptive_entropy", "gate": {"target_entropy": 0.1}})
    assert Engine(TrainSpec.model_validate(above), tmp_path / "above").run() == ExitCode.OK
    steps = [e["metrics"] for e in read_events(tmp_path / "above") if e["type"] == "step"]
    assert all(s["entropy_bonus/coef"] == 0.0 for s in steps)


@pytest.mark.parametrize("chunk_rows", [1, 4, 512])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernels_entropy_gradient_matches_autograd_of_the_naive_computation(
    chunk_rows: int, temperature: float, dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(chunk_rows)
    logits = (torch.randn(3, 5, 37, generator=g) * 2).to(dtype)
    targets = torch.randint(37, (3, 5), generator=g)
    w_lp, w_h = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    leaf = logits.clone().requires_grad_(True)
    stats = token_stats_from_logits(
        leaf, targets, temperature=temperature, chunk_rows=chunk_rows, entropy_grad=True
    )
    assert stats.entropy is not None and stats.entropy.requires_grad
    (stats.logprob * w_lp + stats.entropy * w_h).sum().backward()
    ref = logits.detach().float().requires_grad_(True)
    logp = torch.log_softmax(ref / temperature, -1)
    h = -(logp.exp() * logp).sum(-1)
    (logp.gather(-1, targets[..., None]).squeeze(-1) * w_lp + h * w_h).sum().backward()
    assert leaf.grad is not None and ref.grad is not None
    tol = {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    assert_close(leaf.grad.float(), ref.grad, **tol)
    assert_close(stats.entropy, h.detach(), atol=1e-5, rtol=1e-5)


def test_entropy_grad_needs_the_entropy_and_leaves_it_detached_by_default() -> None:
    logits = torch.randn(4, 9, requires_grad=True)
    targets = torch.randint(9, (4,))
    assert not token_stats_from_logits(logits, targets).entropy.requires_grad
    with pytest.raises(ValueError, match="with_entropy"):
        token_stats_from_logits(logits, targets, with_entropy=False, entropy_grad=True)
