"""The shared target a method without a controller is measured against (experiments/analysis.py): read from
the run's started spec in either form, else from the plan's own spec (validation drops a controller section
from a method that has no controller, so a grpo_ds run starts with none)."""

from __future__ import annotations

from contract import stability
from experiments import analysis as an

ENTROPIES = [(1, 2.0), (2, 1.9), (3, 1.5), (4, 1.45), (5, 1.3), (6, 1.0)]


def _events(algorithm: dict[str, object]) -> list[dict[str, object]]:
    started = {"type": "started", "spec": {"algorithm": algorithm}}
    steps = [{"type": "step", "step": s, "metrics": {an.ENTROPY: h}} for s, h in ENTROPIES]
    return [started, *steps]


def test_the_target_comes_from_either_section_of_the_started_spec_then_from_the_plan() -> None:
    relative = {"target_entropy": {"relative": 0.7}}
    assert an.spec_target({"algorithm": {"gate": relative}}, ENTROPIES) == 0.7 * 2.0
    assert (
        an.spec_target(
            {"algorithm": {"control": {"controller": "entropy_pi", "target_entropy": 1.2}}}, ENTROPIES
        )
        == 1.2
    )
    started = {"algorithm": {"name": "grpo_ds", "control": None}}
    assert an.spec_target(started, ENTROPIES) is None
    assert (
        an.spec_target(started, ENTROPIES, {"algorithm": {"name": "grpo_ds", "gate": relative}}) == 0.7 * 2.0
    )


def test_a_grpo_ds_run_is_held_against_the_plans_target() -> None:
    plan = {"algorithm": {"name": "grpo_ds", "gate": {"target_entropy": {"relative": 0.7}}}}
    events = _events({"name": "grpo_ds", "control": None})
    summary = an.summarize_run("r", events, plan_spec=plan, warmup_steps=0)
    expected = stability.hold_fraction(ENTROPIES, 0.7 * 2.0)
    assert expected[1] > 0
    assert (summary.hold_fraction, summary.post_gate_steps) == expected
    assert an.summarize_run("r", events, warmup_steps=0).hold_fraction is None
