"""The evaluation report: summary numbers computed by hand on a synthetic run, the page, the files."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainer.report import (
    Band,
    Trace,
    build_report,
    line_chart_svg,
    load_events,
    render_html,
    write_report,
)

BAND = (0.2, 0.8)
# Steps 1-5 and 12 above the band, 21-24 below: 10 of 30 out, longest run 5 (steps 1-5).
ENTROPY = {
    **{s: v for s, v in zip(range(1, 6), (1.0, 0.95, 0.9, 0.86, 0.82))},
    **{s: 0.78 - 0.02 * (s - 6) for s in range(6, 12)},
    12: 0.85,
    **{s: 0.7 - 0.055 * (s - 13) for s in range(13, 21)},
    **{s: v for s, v in zip(range(21, 31), (0.18, 0.15, 0.17, 0.19, 0.22, 0.26, 0.29, 0.32, 0.34, 0.36))},
}
GATE_ON_STEPS = set(range(21, 28))  # entropy below the 0.3 target
SPEC = {
    "name": "synthetic run",
    "model": {"name": "tiny-arith"},
    "algorithm": {"name": "stare", "advantage": "grpo", "gate": {"target_entropy": 0.3}},
    "optim": {"steps": 30},
    "entropy_band": {"low": BAND[0], "high": BAND[1]},
}


def _step_metrics(step: int, *, stare: bool = True, band_metrics: bool = True) -> dict[str, float]:
    entropy = ENTROPY[step]
    metrics = {
        "entropy/mean": entropy,
        "quadrant/pos_low_fraction": 0.5 - 0.001 * (30 - step),
        "quadrant/pos_high_fraction": 0.1,
        "quadrant/neg_low_fraction": 0.3,
        "quadrant/neg_high_fraction": 0.1 + 0.001 * (30 - step),
        "quadrant/pos_low_drift": -0.02,
        "quadrant/pos_high_drift": 0.01,
        "quadrant/neg_low_drift": 0.015,
        "quadrant/neg_high_drift": -0.004,
        "quadrant/predicted_drift": 0.001,
        "reward/mean": 0.2 + 0.01 * step,
        "reward/accuracy": 0.25 + 0.01 * step,
        "response/length_mean": 40.0 + step,
        "perf/step_seconds": 2.0,
    }
    if band_metrics:
        state = -1 if entropy < BAND[0] else 1 if entropy > BAND[1] else 0
        metrics |= {"entropy/band_low": BAND[0], "entropy/band_high": BAND[1], "entropy/band_state": state}
    if stare:
        on = step in GATE_ON_STEPS
        metrics |= {
            "stare/gate_on": float(on),
            "stare/target_entropy": 0.3,
            "stare/reweight_w": 1.1 + 0.01 * max(0, step - 20),
            "stare/reweight_m": 0.9,
        }
    return metrics


def _eval(step: int, avg: float, pass_: float, length: float) -> dict[str, Any]:
    metrics = {"eval/avg@k": avg, "eval/pass@k": pass_, "eval/k": 4, "eval/response_length": length}
    return {"type": "eval", "step": step, "metrics": metrics | {"eval/num_prompts": 64}}


def synthetic_events(
    *, stare: bool = True, band_metrics: bool = True, name: str = "synthetic run"
) -> list[dict]:
    spec = SPEC | {"name": name}
    if not stare:
        spec = spec | {"algorithm": {"name": "grpo", "advantage": "grpo"}}
    events: list[dict[str, Any]] = [
        {"type": "started", "time": "2025-01-01T10:00:00+00:00", "spec": spec, "total_steps": 30},
        _eval(0, 0.25, 0.5, 40.0),
    ]
    for step in range(1, 31):
        metrics = _step_metrics(step, stare=stare, band_metrics=band_metrics)
        events.append({"type": "step", "step": step, "time": "2025-01-01T10:01:00+00:00", "metrics": metrics})
        if step % 10 == 0:
            events.append({"type": "checkpoint", "step": step, "path": f"out/checkpoints/step-{step:06d}"})
        if step == 15:
            events.append(_eval(15, 0.3, 0.55, 48.0))
    events.append(_eval(30, 0.4, 0.625, 55.0))
    events.append(
        {"type": "finished", "step": 30, "status": "succeeded", "time": "2025-01-01T11:02:03+00:00"}
    )
    return events


def test_job_summary() -> None:
    job = build_report(synthetic_events())["job"]

    assert (job["algorithm"], job["model"], job["name"]) == ("stare", "tiny-arith", "synthetic run")
    assert (job["steps_done"], job["total_steps"], job["status"]) == (30, 30, "succeeded")
    assert job["duration_s"] == 3723.0
    assert [c["step"] for c in job["checkpoints"]] == [10, 20, 30]


@pytest.mark.parametrize("band_metrics", [True, False], ids=["logged-band-state", "band-from-spec"])
def test_entropy_summary_by_hand(band_metrics: bool) -> None:
    entropy = build_report(synthetic_events(band_metrics=band_metrics))["entropy"]

    assert entropy["fraction_in_band"] == pytest.approx(20 / 30)
    assert (entropy["steps_in_band"], entropy["steps_below"], entropy["steps_above"]) == (20, 4, 6)
    assert entropy["longest_out_of_band_run"] == 5
    assert entropy["current_out_of_band_run"] == 0
    assert (entropy["first"], entropy["last"]) == (1.0, 0.36)
    assert (entropy["min"], entropy["min_step"], entropy["max"], entropy["max_step"]) == (0.15, 22, 1.0, 1)
    assert (entropy["band_low"], entropy["band_high"]) == BAND
    assert entropy["last_state"] == "in_band"


def test_out_of_band_run_spans_a_jump_from_above_to_below() -> None:
    states = [0, 1, 1, -1, -1, 0, 1]
    events = [
        {"type": "step", "step": i + 1, "metrics": {"entropy/band_state": s}} for i, s in enumerate(states)
    ]

    entropy = build_report(events)["entropy"]

    assert entropy["longest_out_of_band_run"] == 4
    assert entropy["current_out_of_band_run"] == 1
    assert entropy["last_state"] == "above"


def test_gate_summary() -> None:
    gate = build_report(synthetic_events())["gate"]

    assert gate["on_fraction"] == pytest.approx(7 / 30)
    assert (gate["on_steps"], gate["toggles"], gate["final_on"]) == (7, 2, False)
    assert gate["final_w"] == pytest.approx(1.2)
    assert (gate["final_m"], gate["target_entropy"]) == (0.9, 0.3)


def test_evaluation_before_after_uses_step_zero_and_the_last_eval() -> None:
    evaluation = build_report(synthetic_events())["evaluation"]

    assert evaluation["before"]["step"] == 0 and evaluation["after"]["step"] == 30
    assert evaluation["delta"]["avg_at_k"] == pytest.approx(0.15)
    assert evaluation["delta"]["pass_at_k"] == pytest.approx(0.125)
    assert evaluation["delta"]["response_length"] == pytest.approx(15.0)
    assert evaluation["k"] == 4
    assert [row["step"] for row in evaluation["history"]] == [0, 15, 30]


def test_final_quadrants_and_series() -> None:
    report = build_report(synthetic_events())

    quadrants = report["quadrants"]
    assert quadrants["step"] == 30
    assert quadrants["fractions"] == {"pos_low": 0.5, "pos_high": 0.1, "neg_low": 0.3, "neg_high": 0.1}
    assert quadrants["predicted_drift"] == 0.001
    series = report["series"]
    assert series["entropy/mean"][:2] == [[1, 1.0], [2, 0.95]] and len(series["entropy/mean"]) == 30
    assert series["eval/avg@k"] == [[0, 0.25], [15, 0.3], [30, 0.4]]
    assert report["response_length"]["train"]["last"] == 70.0


def test_non_stare_run_has_no_gate_and_says_no_data() -> None:
    report = build_report(synthetic_events(stare=False))

    assert report["gate"]["on_fraction"] is None and report["gate"]["target_entropy"] is None
    assert "stare/gate_on" not in report["series"]
    page = render_html(report)
    assert page.count('class="no-data"') == 1  # the gate plot only
    assert "STARE target entropy" not in page


@pytest.mark.parametrize(
    ("last_event", "status"),
    [
        ({"type": "step", "step": 1, "metrics": {}}, "running"),
        ({"type": "interrupted", "step": 1, "signal": 15}, "interrupted"),
        ({"type": "error", "step": 1, "code": "non_finite", "message": "loss is nan"}, "failed"),
        ({"type": "finished", "step": 1, "status": "succeeded"}, "succeeded"),
    ],
)
def test_status_follows_the_last_lifecycle_event(last_event: dict, status: str) -> None:
    job = build_report([synthetic_events()[0], last_event])["job"]

    assert job["status"] == status
    assert job["error"] == ("loss is nan" if status == "failed" else None)


def test_resume_drops_steps_logged_after_the_checkpoint_and_keeps_the_replay() -> None:
    events = synthetic_events()[:-2]  # crashed after step 30, before the final eval
    events.append({"type": "error", "message": "CUDA OOM"})
    events.append({"type": "resumed", "step": 20})
    events += [{"type": "step", "step": s, "metrics": {"entropy/mean": 0.5}} for s in (21, 22)]

    report = build_report(events)

    assert report["job"]["steps_done"] == 22
    assert (report["job"]["status"], report["job"]["error"], report["job"]["resumes"]) == ("running", None, 1)
    assert report["series"]["entropy/mean"][-3:] == [[20, ENTROPY[20]], [21, 0.5], [22, 0.5]]
    assert [row["step"] for row in report["evaluation"]["history"]] == [0, 15]


def test_report_is_strict_json_when_metrics_are_non_finite_or_malformed() -> None:
    events: list[Any] = [
        {"type": "step", "step": 1, "metrics": {"entropy/mean": math.nan, "reward/mean": math.inf}},
        {"type": "step", "step": 2, "metrics": {"entropy/mean": "high", "reward/mean": 0.5}},
        {"type": "step", "metrics": {"entropy/mean": 0.4}},  # no step
        "not an event",
        {"type": "eval", "step": 0, "metrics": None},
    ]

    report = build_report(events)

    json.dumps(report, allow_nan=False)
    assert report["series"] == {"reward/mean": [[2, 0.5]]}
    assert report["entropy"]["first"] is None


def test_page_has_one_svg_per_plot_and_the_shaded_band() -> None:
    page = render_html(build_report(synthetic_events()))

    assert page.count("<svg") == 5
    assert page.count('<rect class="band"') == 1
    assert 'stroke-dasharray="7 5"' in page  # the target entropy line
    assert "no data" not in page
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")


def test_band_from_the_spec_is_shaded_when_not_logged() -> None:
    page = render_html(build_report(synthetic_events(band_metrics=False)))

    assert page.count('<rect class="band"') == 1


def test_a_band_that_changes_is_shaded_piecewise() -> None:
    events = synthetic_events()
    for event in events:
        if event["type"] == "step" and event["step"] > 15:
            event["metrics"]["entropy/band_high"] = 0.9

    report = build_report(events)

    assert (report["entropy"]["band_low"], report["entropy"]["band_high"]) == (0.2, 0.9)
    assert render_html(report).count('<rect class="band"') == 2


def test_spec_strings_are_escaped() -> None:
    events = synthetic_events(name='<script>alert("x")</script>')
    events.append({"type": "checkpoint", "step": 31, "path": "<img src=x onerror=alert(1)>"})

    page = render_html(build_report(events))

    assert "<script>" not in page and "<img" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page


@pytest.mark.parametrize(
    "events", [[], synthetic_events()[:1], synthetic_events()[:3]], ids=["empty", "started", "one-step"]
)
def test_empty_and_one_step_runs_render(events: list[dict]) -> None:
    report = build_report(events)
    page = render_html(report)

    json.dumps(report, allow_nan=False)
    assert page.count("<svg") == 5
    steps = len([e for e in events if e["type"] == "step"])
    assert report["job"]["steps_done"] == steps
    if steps == 1:
        assert report["entropy"]["fraction_in_band"] == 0.0  # step 1 is above the band
        assert report["evaluation"]["after"] is None and report["evaluation"]["delta"]["avg_at_k"] is None
        assert "<circle" in page and "<polyline" not in page
    else:
        assert page.count('class="no-data"') == 5


def test_chart_axis_ticks_one_point_and_no_data() -> None:
    svg = line_chart_svg([Trace("a", [(0, 0.0), (10, 1.0)], "#000")], title="t", y_label="y")
    assert ">0.2<" in svg and ">1.0<" in svg and ">10<" in svg  # y ticks every 0.2, x ticks up to 10

    band = [Band(0, 5, 1, 3)]
    single = line_chart_svg([Trace("a", [(3, 2.0)], "#000")], title="t", y_label="y", bands=band)
    assert single.count("<circle") == 1 and '<rect class="band"' in single

    empty = line_chart_svg([Trace("a", [], "#000")], title="t", y_label="y")
    assert "no data" in empty and "<polyline" not in empty


def test_chart_of_a_long_run_is_thinned_and_keeps_a_spike() -> None:
    points = [(float(s), 50.0 if s == 2345 else 1.0) for s in range(1, 5001)]

    svg = line_chart_svg([Trace("loss", points, "#000")], title="t", y_label="y")

    plotted = [
        tuple(map(float, p.split(","))) for p in svg.split('<polyline points="')[1].split('"')[0].split()
    ]
    assert len(plotted) <= 1200
    ys = sorted({y for _, y in plotted})
    assert len(ys) == 2  # the flat line and the spike, whose pixel is far above it
    assert ys[1] - ys[0] > 100


def test_chart_labels_thousands_with_k() -> None:
    svg = line_chart_svg([Trace("length", [(0, 0.0), (100, 20_000.0)], "#000")], title="t", y_label="tokens")

    assert ">5k<" in svg and ">10k<" in svg and ">20k<" in svg and ">5000<" not in svg


def test_load_events_skips_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = [json.dumps(e) for e in synthetic_events()[:4]]
    path.write_text("\n".join(lines) + '\n{"type": "step", "step": 3, "metr', encoding="utf-8")

    assert load_events(path) == synthetic_events()[:4]


def test_load_events_skips_a_torn_line_before_a_resume(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"type": "started"}\n{"type": "st\xc3{"type": "resumed", "step": 0}\n\n')

    assert load_events(path) == [{"type": "started"}]


def test_write_report_writes_both_files_atomically(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "report.json").write_text("stale")

    json_path, html_path = write_report(synthetic_events(), out)

    assert json.loads(json_path.read_text())["evaluation"]["delta"]["pass_at_k"] == pytest.approx(0.125)
    assert html_path.read_text().startswith("<!doctype html>")
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json"]


def test_a_failed_write_keeps_the_previous_report_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "report.json").write_text("previous")

    def fail(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("trainer.report.files.os.replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_report(synthetic_events(), tmp_path)

    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
    assert (tmp_path / "report.json").read_text() == "previous"


def test_module_imports_no_torch() -> None:
    code = "import sys, trainer.report; assert 'torch' not in sys.modules and 'numpy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


def test_collapse_and_holding_by_hand() -> None:
    # H0 = 1.0 → collapse threshold 0.25: steps 21-25 (0.18 … 0.22) are the first 5 in a row below it.
    # Target 0.3: the first step below it is 21, so the post-gate steps are 21-30; within ±25 % (0.225 ≤ H
    # ≤ 0.375) are 26-30: 5 of 10. The page shows both.
    report = build_report(synthetic_events())
    entropy = report["entropy"]
    assert entropy["collapse_step"] == 21
    assert entropy["post_gate_steps"] == 10
    assert entropy["target_hold_fraction"] == pytest.approx(0.5)
    page = render_html(report)
    assert "Time to collapse" in page and "step 21" in page and "50.0%" in page
    # Without a target (a grpo run) there is no holding share, and the page says so.
    plain = build_report(synthetic_events(stare=False))["entropy"]
    assert plain["collapse_step"] == 21 and plain["target_hold_fraction"] is None
    assert "no post-gate steps" in render_html(build_report(synthetic_events(stare=False)))


def test_holding_as_users_see_it_by_hand() -> None:
    # Target 0.3, band 0.225-0.375 for the 5-step mean. Step 20's mean (steps 16-20) is 0.425; step 21's
    # (0.48, 0.425, 0.37, 0.315, 0.18) is 0.354: settles at 21. Means in the band at 21, 22 (0.288),
    # 23 (0.237), 27-30 (0.226 … 0.314), out at 24-26 (0.201, 0.182, 0.198): 7 of 10. |H − 0.3|/0.3 over
    # 21-30: (0.12 + 0.15 + 0.13 + 0.11 + 0.08 + 0.04 + 0.01 + 0.02 + 0.04 + 0.06)/0.3/10 = 0.2533.
    report = build_report(synthetic_events())
    entropy = report["entropy"]
    assert entropy["settling_step"] == 21
    assert entropy["ma_hold_fraction"] == pytest.approx(0.7)
    assert entropy["mean_abs_deviation"] == pytest.approx(0.76 / 0.3 / 10)
    assert "5-step mean within ±25 % of the target" in render_html(report)
    assert "from step 21" in render_html(report)


def test_the_controller_section_shows_output_error_integral_and_saturation() -> None:
    events = synthetic_events()
    for e in events:
        if e["type"] == "step":
            step = e["step"]
            e["metrics"] |= {
                "control/output": min(1.0, 0.1 * step),
                "control/error": 0.01 * step,
                "control/integral": 0.5 * step,
                "control/actuator": 0.55 * min(1.0, 0.1 * step),
                "control/saturated": float(step >= 10),
                "control/saturated_steps": float(max(0, step - 9)),
            }
    report = build_report(events)
    ctl = report["controller"]
    assert (ctl["final_output"], ctl["final_error"], ctl["final_integral"]) == (1.0, 0.3, 15.0)
    assert ctl["saturated_fraction"] == pytest.approx(21 / 30) and ctl["longest_saturated_run"] == 21
    assert [p[1] for p in report["series"]["control/integral"]][:2] == [0.5, 1.0]
    page = render_html(report)
    assert "Entropy controller (PI law, last step)" in page and "longest run 21 steps" in page
    # At its clip for the last 21 steps (≥ the alert's 20): saturated.
    assert ctl["final_saturated_steps"] == 21 and ctl["saturated"] is True
    assert "at its clip for the last 21 steps: the target cannot be held" in page
    # The charts of u, e and I over the steps, and of the actuator: one polyline per trace.
    assert "<h2>Entropy controller</h2>" in page and "<h2>Controller actuator</h2>" in page
    controller_chart = page.split("<h2>Entropy controller</h2>", 1)[1].split("</figure>", 1)[0]
    for label in ("output u", "error e (relative)", "integral I"):
        assert label in controller_chart
    assert controller_chart.count("<polyline") == 3
    actuator_chart = page.split("<h2>Controller actuator</h2>", 1)[1].split("</figure>", 1)[0]
    assert actuator_chart.count("<polyline") == 1
    # A job without a PI law has no controller rows and no controller charts.
    plain = render_html(build_report(synthetic_events()))
    assert "Entropy controller" not in plain and "Controller actuator" not in plain


def test_a_controller_off_its_clip_is_not_saturated() -> None:
    events = synthetic_events()
    for e in events:
        if e["type"] == "step":
            step = e["step"]
            at_clip = 5 <= step <= 28  # 24 steps at the clip, then off it
            e["metrics"] |= {
                "control/output": 1.0 if at_clip else 0.5,
                "control/saturated": float(at_clip),
                "control/saturated_steps": float(step - 4 if at_clip else 0),
            }
    ctl = build_report(events)["controller"]
    assert ctl["longest_saturated_run"] == 24 and ctl["final_saturated_steps"] == 0
    assert ctl["saturated"] is False
    assert "the target cannot be held" not in render_html(build_report(events))


def test_at_the_lowering_clip_the_report_waits_fifty_steps() -> None:
    """The last 26 steps at u = −0.1 (the approach from above): not saturated; the same at u = +1: saturated."""
    for output, saturated in ((-0.1, False), (1.0, True)):
        events = synthetic_events()
        for e in events:
            if e["type"] == "step":
                step = e["step"]
                e["metrics"] |= {
                    "control/output": output if step >= 5 else 0.0,
                    "control/saturated": float(step >= 5),
                    "control/saturated_steps": float(max(0, step - 4)),
                }
        ctl = build_report(events)["controller"]
        assert ctl["final_saturated_steps"] == 26 and ctl["saturated"] is saturated
