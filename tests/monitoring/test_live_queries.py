"""Every dashboard query and every alert rule, run on a real Prometheus scraping the real stack (API,
worker, exporter) while a tiny job trains: each query returns series for that job (or its queue) and
every value is what its panel expects (a fraction in [0, 1], entropy > 0, the job's step, ...). The
tool-use row runs against a tool-use job (trainer/specs/tool_use_tiny.yaml), the vLLM row against a vLLM job
that then runs to its end (the vLLM job over HTTP).

With STARE_RECORD_QUERY_RESULTS=1 the returned values are written to deploy/grafana/query-results.json,
which docs/metrics.md shows (`python -m monitoring.docs --write`). The GPU panels are the one exception:
their DCGM-exporter series do not exist here (tests/monitoring/test_dashboards.py checks them statically).
"""

from __future__ import annotations

import platform
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from contract import metrics as catalogue
from monitoring.alerts import alert_rules
from monitoring.model import Expect
from monitoring.promql import metric_names
from tests.conftest import requires_binary, requires_vllm_python
from tests.monitoring.stack import (
    RECORD,
    Stack,
    check_alert_selectors,
    check_dashboard_queries,
    dashboard_refs,
    prometheus_names,
    record,
)
from tests.worker.harness import tiny_spec

ROOT = Path(__file__).resolve().parents[2]
TOOL_SPEC = ROOT / "trainer" / "specs" / "tool_use_tiny.yaml"
LAW_RULES = ("ControllerSaturated",)
# Rules whose series only a job of some kind has, each checked on such a job by its row's test below: the
# PI laws' (a law's job) and the grader's (a job rewarded by a grader).
OWN_JOB_RULES = (*LAW_RULES, "GraderErrorsRising")
pytestmark = [pytest.mark.slow, requires_binary("prometheus")]


def _run_facts(stack: Stack, job: str) -> dict[str, str]:
    return {
        f"{job} job": "tiny-arith",
        "date": datetime.now(UTC).date().isoformat(),
        "machine": platform.machine(),
    }


def test_every_dashboard_query_and_alert_selector_returns_series_for_a_live_job(stack: Stack) -> None:
    band = {"low": 0.2, "high": 2.5}
    # Target 5 nats: above the untrained model's entropy, so the gate acts from the first step and the
    # holding panel (post-gate steps) has series.
    algorithm = {"name": "stare", "gate": {"target_entropy": 5.0}}
    spec = tiny_spec(60, 50, algorithm=algorithm, evaluation={"interval": 2}, entropy_band=band)
    job_id = stack.submit(spec)
    frozen = stack.freeze_after(job_id, 4)
    try:
        assert frozen.algorithm == "stare" and frozen.step >= 4
        # Traffic on the API beyond Prometheus's own scrapes, so the request panels have routes to show.
        for _ in range(3):
            assert stack.http.get(f"/v1/jobs/{job_id}").status_code == 200
            assert stack.http.get(f"/v1/jobs/{job_id}/metrics").status_code == 200
        stack.h.wait_for(
            "two scrapes of the API after the requests",
            lambda: stack.prom.query('sum(stare_http_requests_total{route="/v1/jobs/{job_id}"}) >= 3'),
            30,
        )
        refs = dashboard_refs(None)
        assert {r.dashboard.uid for r in refs} == {"stare-job", "stare-fleet", "stare-compare"}
        results = check_dashboard_queries(stack, frozen, refs)
        rules = alert_rules()
        assert len(rules) >= 11
        # The PI laws' and the grader's rules read series only their jobs have: checked in their rows' tests.
        results |= check_alert_selectors(stack, frozen, [r for r in rules if r.name not in OWN_JOB_RULES])

        # Every series the dashboards and rules read is exported, by the exporter or the API.
        exported = prometheus_names(stack)
        used = {n for r in refs for n in metric_names(r.query.expr)} | {
            n for rule in rules if rule.name not in OWN_JOB_RULES for n in metric_names(rule.expr)
        }
        assert used - exported == set(), sorted(used - exported)
        # Spot checks against the job's own numbers.
        step = results["stare-job/Step/A"]["series"][0]["value"]
        assert step == frozen.step == stack.h.job_row(job_id)["current_step"]
        edges = [results[f"stare-job/Entropy, band and target/{r}"]["series"][0]["value"] for r in "BC"]
        assert edges == [band["low"], band["high"]]
        assert results["stare-job/Step/B"]["series"][0]["value"] == 60
        if RECORD:
            record(results, _run_facts(stack, "stare"))
    finally:
        stack.end(frozen)
    # Its job over, the worker answers the exporter's ping: one idle worker, none busy.
    idle = f'stare_workers_idle{{queue="{stack.h.queue}"}} == 1 and on (queue) stare_workers_busy == 0'
    stack.h.wait_for("the worker to show as idle", lambda: stack.prom.query(idle), 30)


def test_the_tool_use_row_returns_series_for_a_tool_use_job(stack: Stack) -> None:
    """Needs trainer/specs/tool_use_tiny.yaml (helper D's tiny tool-use job)."""
    assert TOOL_SPEC.is_file(), f"{TOOL_SPEC} is missing: the tool-use row cannot be proven"
    spec = yaml.safe_load(TOOL_SPEC.read_text())
    spec.setdefault("optim", {})["steps"] = max(int(spec.get("optim", {}).get("steps", 0)), 40)
    job_id = stack.submit(spec)
    frozen = stack.freeze_after(job_id, 2)
    try:
        refs = dashboard_refs("tool-use")
        assert len(refs) == 6 and all(r.dashboard.uid == "stare-job" for r in refs)
        assert {n for r in refs for n in metric_names(r.query.expr)} == {
            m.prometheus for m in catalogue.CATALOGUE if m.key.startswith("tool/")
        }
        results = check_dashboard_queries(stack, frozen, refs)
        mismatches = results["stare-job/Token mismatches/A"]["series"][0]["value"]
        assert mismatches == 0 and Expect.ZERO.admits(mismatches)
        if RECORD:
            record(results, {"tool-use job": "trainer/specs/tool_use_tiny.yaml"})
    finally:
        stack.end(frozen)


def test_the_grader_row_returns_series_for_a_job_with_a_grader(stack: Stack) -> None:
    """The grader row and the GraderErrorsRising rule's selector, on a tiny job rewarded by a multi grader
    (string checks combined by a formula). Not a python grader: this stack's worker runs as root, where the
    grader sandbox cannot start inside the trainer's confinement (docs/GRADERS.md); the metrics are the
    same whatever the grader's type."""
    check = {"type": "string_check", "input": "{{sample.output_text}}", "reference": "{{item.answer}}"}
    grader = {
        "type": "multi",
        "graders": {"exact": {**check, "operation": "eq"}, "contains": {**check, "operation": "like"}},
        "calculate_output": "max(exact, 0.5 * contains)",
    }
    spec = tiny_spec(60, 50, grader=grader)
    del spec["verifier"]  # a grader replaces the verifier
    job_id = stack.submit(spec)
    frozen = stack.freeze_after(job_id, 2)
    try:
        refs = dashboard_refs("a grader")
        assert len(refs) == 10 and all(r.dashboard.uid == "stare-job" for r in refs)
        assert {n for r in refs for n in metric_names(r.query.expr)} == {
            m.prometheus for m in catalogue.CATALOGUE if m.key.startswith("grader/") and m.prometheus
        }
        results = check_dashboard_queries(stack, frozen, refs)
        rules = [r for r in alert_rules() if r.name == "GraderErrorsRising"]
        results |= check_alert_selectors(stack, frozen, rules)
        assert results["stare-job/Grader failures/A"]["series"][0]["value"] == 0
        if RECORD:
            record(results, {"grader job": "tiny-arith, a multi grader of two string checks"})
    finally:
        stack.end(frozen)


def test_the_controller_row_returns_series_for_a_pi_law_job(stack: Stack) -> None:
    """The PI law's row (entropy_pi, the default law): output, error, integral, actuator, saturation and
    the holding statistics, and the ControllerSaturated rule's selector. The target is H₀ itself
    (relative 1.0), so the 5-step moving average settles within the first steps."""
    spec = tiny_spec(60, 50, algorithm={"control": {"target_entropy": {"relative": 1.0}}})
    job_id = stack.submit(spec)
    frozen = stack.freeze_after(job_id, 7)
    try:
        assert frozen.algorithm == "entropy_pi"
        refs = dashboard_refs("a PI entropy law")
        assert len(refs) == 10 and all(r.dashboard.uid == "stare-job" for r in refs)
        results = check_dashboard_queries(stack, frozen, refs)
        results |= check_alert_selectors(stack, frozen, [r for r in alert_rules() if r.name in LAW_RULES])
        settled = results["stare-job/Held as users see it/C"]["series"][0]["value"]
        assert 5 <= settled <= frozen.step
        if RECORD:
            record(results, {"PI-law job": "tiny-arith, entropy_pi, target relative 1.0"})
    finally:
        stack.end(frozen)


# The vLLM job: the tiny model after a short SFT, STARE, vLLM rollouts with a truncated IS weight capped at 2. It
# is frozen after step 2 for the row's queries, then runs to its end (the job over HTTP that
# tests/trainer/test_vllm_stack.py ran on the embedded stack is this one: one vLLM launch, not two).
VLLM_STEPS = 6
VLLM_SPEC = {
    "model": {"name": "tiny-arith"},
    "task": {"source": "arithmetic", "train_size": 64, "eval_size": 16},
    "verifier": {"name": "numeric", "params": {"abs_tol": 60}},
    "algorithm": {"name": "stare"},
    "rollout": {"engine": "vllm", "tis_cap": 2.0},
    "sampling": {"group_size": 4, "max_new_tokens": 5},
    "optim": {"steps": VLLM_STEPS, "prompts_per_step": 3, "micro_batch_size": 6},
    "sft": {"steps": 60, "lr": 3e-3, "batch_size": 32},
    "checkpoint": {"interval": 100},
}


@requires_vllm_python()
def test_the_rollout_engine_row_returns_series_for_a_vllm_job(stack: Stack) -> None:
    """The vLLM row (rollout.engine vllm): the sampler-trainer mismatch and the truncated IS weight. Then the
    job, thawed, runs to its end over HTTP: the worker runs its trainer with vLLM's interpreter
    (STARE_VLLM_PYTHON), the job succeeds, every step carries the rollout mismatch metrics, and the
    evaluations before and after training ran (on the vLLM engine)."""
    job_id = stack.submit(VLLM_SPEC)
    frozen = stack.freeze_after(job_id, 2)
    assert frozen.step < VLLM_STEPS, "the job must still have steps to run when it is frozen"
    try:
        refs = dashboard_refs("rollout.engine vllm")
        assert len(refs) == 4 and all(r.dashboard.uid == "stare-job" for r in refs)
        results = check_dashboard_queries(stack, frozen, refs)
        weight = results["stare-job/Truncated IS weight/A"]["series"][0]["value"]
        assert 0 < weight <= 2.0
        if RECORD:
            record(results, {"vllm job": "tiny-arith, rollout.engine vllm, tis_cap 2"})
    finally:
        frozen.thaw()
    stack.h.wait_status(job_id, "succeeded", timeout=240)
    rows = stack.http.get(f"/v1/jobs/{job_id}/metrics").json()["data"]
    assert [row["step"] for row in rows] == list(range(1, VLLM_STEPS + 1))
    for row in rows:
        values = row["values"]
        assert 0.0 <= values["rollout/mismatch_abs_max"] < 1e-2, values
        assert values["rollout/tis_capped_fraction"] == 0.0
    report = stack.http.get(f"/v1/jobs/{job_id}/report").json()
    assert report["evaluation"]["after"]["step"] == VLLM_STEPS
