"""The engine's samples and warnings (trainer/samples.py, trainer/warnings.py) on the tiny model: one token
per response cuts (nearly) every one, so the truncation warning comes at step 3 and again on the last step;
each evaluation keeps its first held-out examples, the first training step two of its responses, every
event as contract/protocol.py declares it, and the report shows them."""

from __future__ import annotations

from pathlib import Path

from contract.protocol import check_event
from contract.samples import SAMPLES_PER_EVAL, TRAIN_SAMPLES
from contract.spec import TrainSpec
from tests.trainer.test_engine import read_events, small_spec
from trainer.engine import Engine, ExitCode
from trainer.report import build_report


def test_a_run_whose_responses_are_cut_warns_and_keeps_samples(tmp_path: Path) -> None:
    spec = TrainSpec.model_validate(
        small_spec(sampling={"max_new_tokens": 1}, optim={"steps": 4}, evaluation={"interval": 2})
    )
    engine = Engine(spec, tmp_path / "run")
    assert engine.run() == ExitCode.OK
    events = read_events(tmp_path / "run")
    for event in events:
        check_event(event)
    samples = {(e["phase"], e["step"]): e["samples"] for e in events if e["type"] == "samples"}
    assert sorted(samples) == [("eval", 0), ("eval", 2), ("eval", 4), ("train", 1)]
    first = [s["prompt"] for s in samples["eval", 0]]
    assert first == [e.prompt for e in engine.eval_examples[:SAMPLES_PER_EVAL]]
    assert [s["reference"] for s in samples["eval", 4]] == [
        e.answer for e in engine.eval_examples[:SAMPLES_PER_EVAL]
    ]
    assert len(samples["train", 1]) == TRAIN_SAMPLES
    for sample in [s for found in samples.values() for s in found]:
        assert len(sample["completion"]) <= 1 or sample["completion"].startswith("<")  # one token
        assert sample["reward"] in (0.0, 1.0)
    cut = [e for e in events if e["type"] == "warning" and e["kind"] == "truncated_responses"]
    assert [(e["step"], e["count"], e["first_step"]) for e in cut] == [(3, 1, 3), (4, 2, 3)]
    steps = {e["step"]: e["metrics"] for e in events if e["type"] == "step"}
    assert all(steps[s]["response/truncated_fraction"] >= 0.5 for s in (1, 2, 3, 4))
    report = build_report(events)
    assert report["samples"]["eval_first"]["samples"] == samples["eval", 0]
    assert report["samples"]["eval_last"] == {"step": 4, "samples": samples["eval", 4]}
    assert [w["kind"] for w in report["warnings"]].count("truncated_responses") == 1
