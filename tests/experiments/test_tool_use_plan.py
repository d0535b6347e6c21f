"""The results plan's tool-use suites: every run is a valid tool-use job spec, the comparison's arms start
from their seed's shared SFT, and the robustness suite covers seeds at 1 and 2 torch threads."""

from __future__ import annotations

from contract.spec import TrainSpec
from experiments.plan import SFT_REF, build_plan


def test_the_tool_use_suites_are_valid_tool_use_jobs() -> None:
    assert not {"tool-use", "tool-use-seeds"} & {s.name for s in build_plan(quick=True)}  # its 10 min
    for suites in (
        {s.name: s for s in build_plan()},
        {s.name: s for s in build_plan(suites=("tool-use", "tool-use-seeds"))},
    ):
        comparison, seeds = suites["tool-use"], suites["tool-use-seeds"]
        assert set(comparison.arms) == {"grpo_ds", "stare_o1"} and seeds.robustness
        for run in (*comparison.runs, *seeds.runs):
            spec = dict(run.spec)
            if str(spec["model"]["name"]).startswith(SFT_REF):
                assert run.needs == (spec["model"]["name"][len(SFT_REF) :],)
                spec["model"] = {"name": "tiny-arith"}  # what the SFT run's folder will hold
            parsed = TrainSpec.model_validate(spec)
            assert parsed.environment is not None and parsed.environment.tools == ["calculator"]
            assert parsed.task.params["operations"] == ["*"]
        arms = [r for r in comparison.runs if r.arm is not None]
        assert {r.arm for r in arms} == {"grpo_ds", "stare_o1"}
        assert {r.seed for r in arms} == {r.seed for r in comparison.runs if r.name.startswith("sft/")}
        assert {r.threads for r in seeds.runs} == {1, 2}
        assert len({r.seed for r in seeds.runs}) >= 2
        assert all(r.spec["sft"]["steps"] > 0 for r in seeds.runs)  # each with its own SFT
