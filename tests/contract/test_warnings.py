"""Warnings instead of silence (contract/warnings.py) and the samples' bounds (contract/samples.py): each
rule at its threshold and one short of it, the deduplication, and the messages saying what to change."""

from __future__ import annotations

from typing import Any

from contract import samples, warnings
from contract.catalog import MODEL_ALPHABETS, TINY_ARITH
from contract.spec import TrainSpec
from contract.warnings import StepWatch


def _spec(**data: Any) -> TrainSpec:
    return TrainSpec.model_validate(data)


def test_unknown_characters_are_counted_with_the_records_and_the_template() -> None:
    records = [
        {"prompt": "Tom has 3", "answer": "3"},
        {"prompt": "1+2=", "answer": "3"},
        {"prompt": "x", "answer": "é"},
    ]
    found = warnings.unknown_characters(MODEL_ALPHABETS[TINY_ARITH], "Q: ", records)
    assert found is not None and found["kind"] == warnings.UNKNOWN_CHARACTERS
    # "Tomhas" (6) + "x" + "é" in the records, "Q:" in the template: 10 characters, all distinct
    assert found["count"] == 10
    assert "10 characters in task.prompt_template and 2 records (10 distinct" in found["message"], found
    assert "pick a model" in found["message"]
    assert (
        warnings.unknown_characters(MODEL_ALPHABETS[TINY_ARITH], "", [{"prompt": "1+2=", "answer": "3"}])
        is None
    )


def test_spec_warnings_name_the_field_to_set() -> None:
    chat = warnings.spec_warnings(_spec(model={"name": "smollm2-135m-instruct"}))
    assert [w["kind"] for w in chat] == [warnings.NO_CHAT_TEMPLATE]
    assert "task.use_chat_template: true" in chat[0]["message"]
    templated = _spec(model={"name": "smollm2-135m-instruct"}, task={"use_chat_template": True})
    assert warnings.spec_warnings(templated) == []
    assert warnings.spec_warnings(_spec()) == []  # tiny-arith on its own arithmetic: nothing to say
    words = _spec(task={"prompt_template": "What is {prompt}"})
    assert [w["kind"] for w in warnings.spec_warnings(words)] == [warnings.UNKNOWN_CHARACTERS]


def _watch(steps: int = 30, **kwargs: Any) -> StepWatch:
    return StepWatch(total_steps=steps, max_new_tokens=8, **kwargs)


def _run(watch: StepWatch, per_step: list[dict[str, float]]) -> list[dict[str, Any]]:
    return [w for step, metrics in enumerate(per_step, start=1) for w in watch.observe(step, metrics)]


def test_truncation_warns_after_three_steps_in_a_row_then_every_ten_and_on_the_last() -> None:
    cut, fine = {"response/truncated_fraction": 0.5}, {"response/truncated_fraction": 0.49}
    assert _run(_watch(), [cut, cut, fine, cut, cut, fine]) == []  # never 3 in a row
    found = _run(_watch(steps=25), [cut] * 25)
    assert [(w["step"], w["count"], w["first_step"]) for w in found] == [
        (3, 1, 3),
        (13, 11, 3),
        (23, 21, 3),
        (25, 23, 3),
    ]
    assert all(w["kind"] == warnings.TRUNCATED_RESPONSES for w in found)
    assert (
        "50% of this step's responses were cut at sampling.max_new_tokens (8 tokens)" in found[0]["message"]
    )
    assert "raise sampling.max_new_tokens" in found[0]["message"]


def test_a_constant_reward_warns_after_five_steps_with_no_advantage_anywhere() -> None:
    flat, some = {"reward/zero_std_fraction": 1.0, "reward/mean": 0.0}, {"reward/zero_std_fraction": 0.9}
    assert _run(_watch(), [flat] * 4 + [some] + [flat] * 4) == []
    [found] = _run(_watch(), [flat] * 5)
    assert (found["kind"], found["step"]) == (warnings.CONSTANT_REWARD, 5)
    assert "no response has an advantage" in found["message"] and "sample completions" in found["message"]


def test_entropy_far_from_the_band_or_target_at_the_start_says_what_to_set() -> None:
    band = {"entropy/band_low": 0.1, "entropy/band_high": 1.0}
    [above] = _watch().observe(1, {"entropy/mean": 2.2, **band})
    assert above["kind"] == warnings.ENTROPY_FAR_FROM_BAND
    assert "far above entropy_band [0.10, 1.00]" in above["message"] and "[1.10, 4.40]" in above["message"]
    assert _watch().observe(1, {"entropy/mean": 1.9, **band}) == []  # within a factor 2 of the band
    assert _watch().observe(2, {"entropy/mean": 2.2, **band}) == []  # only the first RL step's H0
    [below] = _watch().observe(1, {"entropy/mean": 0.04, **band})
    assert "far below" in below["message"]
    [target] = _watch().observe(
        1, {"entropy/mean": 2.0, "entropy/target": 0.3, "entropy/band_low": 0.0, "entropy/band_high": 9.0}
    )
    assert "far from the target 0.300" in target["message"] and "{relative: r}" in target["message"]
    assert _watch(relative_target=True).observe(1, {"entropy/mean": 2.2, **band}) == []


def test_samples_are_clipped_and_a_reader_keeps_only_well_formed_ones() -> None:
    long = "x" * (samples.SAMPLE_TEXT_CHARS + 50)
    one = samples.sample(long, long, None, 1, truncated=True)
    assert len(one["prompt"]) == samples.SAMPLE_TEXT_CHARS and one["completion"].endswith(samples.ELLIPSIS)
    assert one["reward"] == 1.0 and one["reference"] is None
    junk: list[Any] = [None, "text", {"prompt": "p"}, {"completion": "c", "reward": float("nan"), "extra": 1}]
    checked = samples.checked_samples(junk + [one] * 10)
    assert checked[0] == {
        "prompt": "",
        "completion": "c",
        "reference": None,
        "reward": 0.0,
        "truncated": False,
    }
    assert len(checked) == samples.SAMPLES_PER_EVAL
    assert samples.checked_samples("not a list") == []
    assert [s for s in range(1, 31) if samples.train_sample_step(s)] == [1, 10, 20, 30]
