"""entropy_split (contract/control/split.py, trainer/algos/split_control.py; docs/ALGORITHMS.md §12): the law on
the simulated plant (experiments/plant_model.py), each damping feature pinned by a test that fails without it
(the rate limit, the filter, the anti-windup of either actuator, the bumpless transfer), the floor mode, the
actuators' losses against naive references, and the engine (the sensor, a checkpoint and an exact resume)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import torch

from contract import control
from contract.control.split import SplitLossParams, SplitSettings, SplitState, split_step
from contract.spec import TrainSpec
from experiments.plant_model import Plant, run
from trainer.algos import compute_policy_loss
from trainer.algos.losses import PolicyLossInputs
from trainer.engine import Engine, ExitCode

from .test_engine import read_events, small_spec, step_metrics

TARGET = 0.7
# A quiet plant near the target: the tests look at the law's mechanics, not at noise.
QUIET = Plant(h0=TARGET, init_drift=0.0, accel=0.0, process_noise=0.0, tail=0.0, measurement_noise=0.0)


def _law(**settings: float | str):  # type: ignore[no-untyped-def]
    bound = control.bind("entropy_split", target_entropy=TARGET, **settings)

    def step(state: SplitState, h: float) -> tuple[SplitState, float, float]:
        state = bound.update(state, h)
        return state, state.bonus, state.sharpen

    return step, bound.initial_state()


# ------------------------------------------------------------------------------------------ the law


def test_at_the_target_with_no_drift_the_law_does_nothing() -> None:
    step, state = _law()
    trace = run(QUIET.scaled(drift=0.0), step, state, steps=20)
    assert all(s.output == 0.0 and s.bonus == 0.0 and s.sharpen == 0.0 for s in trace.states)


def test_the_rate_limit_bounds_how_fast_the_actuation_builds_up() -> None:
    # A start far below the target and a noisy sensor ask for big moves; |u| grows at most `rate` a step
    # (backing off toward 0 is free, and a crossing counts from 0).
    rate = SplitSettings.model_fields["rate"].default
    step, state = _law()
    noisy = Plant(h0=0.3 * TARGET, measurement_noise=0.3, process_noise=0.1)
    trace = run(noisy, step, state, steps=80, seed=1)
    pairs = list(zip([state, *trace.states], trace.states, strict=False))
    growth = [abs(b.output) - (abs(a.output) if a.output * b.output > 0 else 0.0) for a, b in pairs]
    assert max(growth) <= rate + 1e-12
    assert max(abs(b.output - a.output) for a, b in pairs) > rate  # backing off is not held
    assert any(s.rate_limited for s in trace.states)  # the limit really held the output


def test_the_filter_attenuates_sensor_noise_in_the_proportional_term() -> None:
    # The plant sits at the target (the actuators have no effect) and only the sensor is noisy. With the rate
    # limit and the integral out of the way, u = Kp·e_f: the EMA with λ divides the noise's sd by
    # sqrt((1 + λ)/(1 − λ)) (3 at λ = 0.8). Without the filter u would carry Kp × the raw noise.
    lam = 0.8
    step, state = _law(filter=lam, ki=0.0, rate=100.0, kp=1.0)
    trace = run(QUIET.scaled(drift=0.0, measurement_noise=0.1), step, state, steps=400, seed=2,
                actuator_works=lambda k: False)  # fmt: skip
    u = [s.output for s in trace.states[20:]]
    e = [s.error for s in trace.states[20:]]
    assert statistics.pstdev(u) <= 1.2 * statistics.pstdev(e) * math.sqrt((1 - lam) / (1 + lam))


def _saturate_then_release(side: int, steps: int = 140, **settings: float):  # type: ignore[no-untyped-def]
    """The actuator on `side` (+1 raising, −1 lowering) is useless for 50 steps while a drift pushes entropy
    the other way, then works again: entropy must come back to the band and stay, without overshoot."""
    step, state = _law(**settings)
    plant = QUIET.scaled(drift=0.03 * side, b_up=0.6, b_down=0.3, momentum=0.0)
    return run(plant, step, state, steps=steps, actuator_works=lambda k: k >= 50), TARGET


@pytest.mark.parametrize(("side", "clip"), [(1, "u_max"), (-1, "u_min")])
def test_no_windup_of_either_actuator_while_it_is_saturated(side: int, clip: str) -> None:
    trace, target = _saturate_then_release(side)
    limit = SplitSettings.model_fields[clip].default
    held = [s for s in trace.states[:50] if abs(s.output) == limit]
    assert len(held) >= 20  # at the clip, on the drift's side, for the last 20+ steps of the outage
    assert len({s.integral for s in held}) == 1  # the integral froze at the clip (without: +e a step)
    after = trace.true[50:]
    # released, entropy comes back and stays in the band; a wound-up integral (~1 a step for 30 steps) would
    # hold the actuator at its clip long after, far past the target on the other side
    assert max(abs(h - target) / target for h in after) <= max(abs(after[0] - target) / target, 1.0)
    assert all(abs(h - target) <= 0.25 * target for h in after[-40:]), [round(h / target, 2) for h in after]


def test_crossing_zero_is_bumpless() -> None:
    """The two actuators are continuous in u and both 0 at u = 0; the one integral carries across the
    crossing (no reset), so α and κ never jump when the law hands over from one to the other."""
    p = SplitSettings(target_entropy=TARGET)
    for u in (-1.0, -0.3, -1e-9, 0.0, 1e-9, 0.3, 1.0):
        alpha, kappa = p.actuators(u)
        assert alpha == pytest.approx(p.span_up * max(u, 0.0)) and kappa == pytest.approx(
            p.span_down * max(-u, 0)
        )
        assert alpha * kappa == 0.0  # one side at a time
    step, state = _law()
    plant = QUIET.scaled(h0=1.4 * TARGET, drift=0.03, b_up=0.6, b_down=0.6)
    # settled with the bonus on, a push up makes the law hand over to the lowering side and back
    trace = run(plant, step, state, steps=120, seed=3, disturbance=lambda k: 0.5 if k == 50 else 0.0)
    states = [state, *trace.states]
    crossings = [k for k in range(1, len(states)) if states[k - 1].output * states[k].output < 0]
    assert crossings, "the run must hand over between the actuators"
    for k in range(1, len(states)):
        a, b = states[k - 1], states[k]
        jump = abs(b.bonus - a.bonus) + abs(b.sharpen - a.sharpen)
        assert jump <= max(p.span_up, p.span_down) * abs(b.output - a.output) + 1e-12
    for k in crossings:  # the integral is the one before plus the error, or held; never reset
        assert states[k].integral in (states[k - 1].integral, states[k - 1].integral + states[k].error)


def test_the_integral_removes_a_constant_drift() -> None:
    step, state = _law()
    trace = run(QUIET.scaled(drift=0.05, b_up=0.6), step, state, steps=200)
    assert abs(statistics.fmean(s.error for s in trace.states[-40:])) < 0.01


def test_a_non_finite_measurement_leaves_the_state_unchanged_and_a_resume_is_exact() -> None:
    p = SplitSettings(target_entropy=TARGET)
    state = split_step(SplitState(), 0.5, p)
    assert split_step(state, float("nan"), p) == state
    restored = SplitState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert split_step(restored, 0.6, p) == split_step(state, 0.6, p)


# ------------------------------------------------------------------------------------------ floor mode


def test_floor_mode_is_silent_above_its_floor_and_never_lowers() -> None:
    step, state = _law(mode="floor")
    # above the floor all the way: no output, no integral
    high = run(QUIET.scaled(h0=1.5 * TARGET, drift=0.0, measurement_noise=0.05), step, state, steps=40)
    assert all(s.output == 0.0 and s.integral == 0.0 for s in high.states)
    # a drift takes entropy through the floor: the law raises it back and never uses the lowering side
    step, state = _law(mode="floor")
    trace = run(QUIET.scaled(h0=1.5 * TARGET, drift=0.05, b_up=0.6), step, state, steps=150)
    assert all(s.output >= 0.0 and s.sharpen == 0.0 for s in trace.states)
    assert min(trace.true[60:]) >= 0.75 * TARGET
    assert any(s.output > 0 for s in trace.states)
    assert all(s.integral >= 0.0 for s in trace.states)


# ------------------------------------------------------------------------------------------ the actuators


def _inputs(seed: int = 0) -> PolicyLossInputs:
    g = torch.Generator().manual_seed(seed)
    logprob = torch.log(torch.rand(4, 6, generator=g).clamp(0.02, 0.99))
    return PolicyLossInputs(
        logprob=logprob.clone().requires_grad_(True),
        old_logprob=logprob,
        advantages=torch.tensor([1.0, -0.5, 0.0, 0.7]),
        response_mask=torch.ones(4, 6),
        entropy=torch.rand(4, 6, generator=g).requires_grad_(True),
    )


def test_at_rest_the_loss_is_grpo_ds_bit_for_bit() -> None:
    inputs = _inputs()
    mine, _ = compute_policy_loss("entropy_split", inputs, control=SplitState())
    theirs, _ = compute_policy_loss("grpo_ds", inputs)
    assert torch.equal(mine, theirs)


def test_the_lowering_actuator_weights_confident_tokens_by_the_advantage_sign() -> None:
    inputs = _inputs(1)
    params = SplitLossParams(p_conf=0.5)
    kappa = 0.4
    mine, _ = compute_policy_loss(
        "entropy_split", inputs, params, control=SplitState(output=-0.8, sharpen=kappa)
    )
    (grad_mine,) = torch.autograd.grad(mine, inputs.logprob)
    base, _ = compute_policy_loss("grpo_ds", inputs)
    (grad_base,) = torch.autograd.grad(base, inputs.logprob)
    confident = inputs.old_logprob >= math.log(0.5)
    adv = inputs.advantages[:, None].expand(4, 6)
    weight = torch.where(confident, 1.0 + kappa * torch.sign(adv), torch.ones_like(adv))
    torch.testing.assert_close(grad_mine, weight * grad_base)  # ∂loss/∂ℓ scaled by ω, token by token


def test_the_bonus_reaches_only_rows_with_an_advantage() -> None:
    inputs = _inputs(2)
    alpha = 0.3
    loss, _ = compute_policy_loss("entropy_split", inputs, control=SplitState(output=0.6, bonus=alpha))
    (grad_h,) = torch.autograd.grad(loss, inputs.entropy)
    n = float(inputs.response_mask.sum())
    expected = -alpha * (inputs.advantages != 0).float()[:, None].expand(4, 6) / n
    torch.testing.assert_close(grad_h, expected)
    assert torch.all(grad_h[2] == 0)  # the Â = 0 row: inert, so the engine may skip it


# ------------------------------------------------------------------------------------------ the engine


def _spec(steps: int, micro: int = 5) -> TrainSpec:
    data = small_spec(
        optim={"steps": steps, "micro_batch_size": micro}, checkpoint={"interval": 2, "keep_last": 5}
    )
    data["algorithm"] = {"control": {"controller": "entropy_split", "target_entropy": {"relative": 1.5}}}
    return TrainSpec.model_validate(data)


def test_the_engine_runs_the_law_checkpoints_it_and_resumes_it_exactly(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    assert Engine(_spec(4), whole).run() == ExitCode.OK
    full = step_metrics(read_events(whole))
    assert all(full[s]["control/output"] > 0 for s in (2, 3, 4))  # below 1.5 × H₀: the bonus acts
    assert all(full[s]["control/bonus"] > 0 and full[s]["control/sharpen"] == 0 for s in (2, 3, 4))
    part = tmp_path / "part"
    assert Engine(_spec(2), part).run() == ExitCode.OK
    assert Engine(_spec(4), part, resume=True).run() == ExitCode.OK
    resumed = step_metrics(read_events(part))
    keys = ("control/output", "control/integral", "control/filtered_error", "entropy/mean")
    for s in (3, 4):
        assert {k: resumed[s][k] for k in keys} == {k: full[s][k] for k in keys}


def test_the_sensor_does_not_depend_on_the_micro_batch_split(tmp_path: Path) -> None:
    """H̄ of the first step (same rollout, before any update) is the same to 1e-6 whether the step batch is
    scored in micro-batches of 5 rows or in one pass (docs/ALGORITHMS.md §12.3)."""
    first = {}
    for micro in (5, 64):
        out = tmp_path / f"mb{micro}"
        assert Engine(_spec(1, micro), out).run() == ExitCode.OK
        first[micro] = step_metrics(read_events(out))[1]["entropy/mean"]
    assert first[5] == pytest.approx(first[64], rel=1e-6)


def test_the_lowering_side_waits_until_the_entropy_has_come_down_to_the_target() -> None:
    """From H₀ above the target the law does not lower (RL's drift does; lowering on top deepens the
    undershoot, §12.1): the output stays ≥ 0 until the entropy first reaches the target; a later push above
    the target is trimmed with the lowering actuator."""
    step, state = _law()
    plant = QUIET.scaled(h0=1.6 * TARGET, drift=0.03, b_up=0.6, b_down=0.6)
    trace = run(plant, step, state, steps=100, disturbance=lambda k: 0.5 if k == 60 else 0.0)
    first = next(k for k, s in enumerate(trace.states) if s.armed)
    assert first > 5 and all(s.output >= 0 and s.sharpen == 0 for s in trace.states[:first])
    assert trace.measured[first] <= TARGET * 1.05
    assert any(s.sharpen > 0 for s in trace.states[60:])  # armed: the push is trimmed from above
