"""The SmolLM2 page's verdict per method: "held the target" only when every seed of the suite finished without
collapsing and with at least HELD_SHARE of its post-gate steps in the band; the differences it names are the
significant ones of the paired comparison, with their sign."""

from __future__ import annotations

from typing import Any

from experiments import analysis as an
from experiments.plan import Run, Suite
from experiments.stability_page import HELD_SHARE, held_target, verdict_lines

SEEDS = (0, 1, 2)


def _summary(arm: str, seed: int, *, collapse: int | None, hold: float, final: float) -> an.RunSummary:
    return an.RunSummary(
        run=f"s/{arm}/seed{seed}", arm=arm, seed=seed, threads=1, steps=100, finished=True,
        sft_avg=0.1, sft_pass=0.2, final_avg=final, final_pass=0.9, k=2,
        entropy_first=0.9, entropy_last=0.05 if collapse else 0.6, entropy_min=0.01, in_band_fraction=0.1,
        collapse_step=collapse, gate_on_fraction=None, near_target_fraction=None, first_control_step=None,
        response_length=4.0, wall_seconds=700.0, reweight_ratio_when_on=None, mean_weight_when_on=None,
        collapse_time=collapse, hold_fraction=hold, post_gate_steps=90,
    )  # fmt: skip


def _suite(arms: tuple[str, ...]) -> Suite:
    runs = tuple(Run("s", f"{a}/seed{s}", {}, arm=a, seed=s) for a in arms for s in SEEDS)
    return Suite("s", "s", "", runs, arms=arms, stability=True)


def _rows(suite: Suite, runs: list[dict[str, Any]]) -> dict[str, list[str]]:
    lines = "\n".join(verdict_lines(suite, runs)).splitlines()
    table = [line for line in lines if line.startswith("| ") and not line.startswith("| method")]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in t.strip("|").split("|")] for t in table)}


def test_held_only_without_collapse_and_with_the_share_on_every_seed() -> None:
    ok = [_summary("a", s, collapse=None, hold=HELD_SHARE + 0.1, final=0.8) for s in SEEDS]
    assert held_target(ok)
    one_short = [*ok[:2], _summary("a", 2, collapse=None, hold=HELD_SHARE - 0.01, final=0.8)]
    assert not held_target(one_short)
    one_collapsed = [*ok[:2], _summary("a", 2, collapse=40, hold=0.9, final=0.8)]
    assert not held_target(one_collapsed)
    assert not held_target([])


def test_the_verdict_names_the_significant_differences_with_their_sign() -> None:
    suite = _suite(("grpo_ds", "holder", "same"))
    control = [_summary("grpo_ds", s, collapse=10 + s, hold=0.0, final=0.80 + 0.01 * s) for s in SEEDS]
    holder = [_summary("holder", s, collapse=None, hold=0.7 + 0.05 * s, final=0.70 + 0.02 * s) for s in SEEDS]
    same = [
        _summary("same", s, collapse=10 + s + (s % 2), hold=0.0, final=0.80 + 0.01 * (2 - s)) for s in SEEDS
    ]
    runs = [{"summary": x, "events": []} for x in control + holder + same]
    rows = _rows(suite, runs)
    assert rows["grpo_ds"][:3] == ["no", "0.00–0.00", "3/3"]
    held, share, collapsed, effects = rows["holder"]
    assert (held, share, collapsed) == ("yes", "0.70–0.80", "0/3")
    assert "collapse later (+90.0" in effects  # 101 (never collapsed) − 10..12
    assert "accuracy lower (-0.090" in effects  # 0.70..0.74 − 0.80..0.82
    assert "more steps in the band" in effects
    assert rows["same"][0] == "no"
    assert rows["same"][3].startswith("none significant")


def test_a_method_with_seeds_missing_is_not_judged() -> None:
    suite = _suite(("grpo_ds", "holder"))
    runs = [
        {"summary": _summary("grpo_ds", s, collapse=10, hold=0.0, final=0.8), "events": []} for s in SEEDS
    ]
    runs.append({"summary": _summary("holder", 0, collapse=None, hold=0.9, final=0.8), "events": []})
    rows = _rows(suite, runs)
    assert rows["holder"][0] == "not yet known (1 of 3 seeds)"
    assert rows["holder"][3] == "– (1 paired seed(s); 3 needed)"
