"""The metric catalogue (contract.metrics): docs/metrics.md is its rendering (with the dashboards' panels and
recorded query values, monitoring.docs), every key the trainer emits is in it, and the exporter and the job
view read it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from contract import metrics
from contract.algorithms import ADVANTAGE_ESTIMATOR_NAMES, ALGORITHMS
from contract.metrics import BandState
from contract.protocol import EventType

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def test_the_committed_docs_are_the_catalogue_rendered() -> None:
    from monitoring import docs

    committed = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert committed == docs.render(), "run `python -m monitoring.docs --write`"
    assert committed.startswith(metrics.render_markdown(docs.panels_by_series()))
    # The doc reads the committed results file: a changed value there changes the doc.
    results = docs.load_results()
    key = "stare-job/Step/A"
    assert key in results["results"], "run the live test with STARE_RECORD_QUERY_RESULTS=1"
    results["results"][key]["series"][0]["value"] = 123456.0
    assert "step=123456" in docs.render(results) and "step=123456" not in committed


def test_every_catalogued_metric_is_documented_once() -> None:
    text = metrics.render_markdown()
    for metric in metrics.CATALOGUE:
        assert text.count(f"| `{metric.key}` |") == 1, metric.key
        if metric.prometheus is not None:
            assert f"`{metric.prometheus}`" in text


def test_keys_and_prometheus_names_are_unique_and_well_formed() -> None:
    keys = [m.key for m in metrics.CATALOGUE]
    assert len(keys) == len(set(keys))
    names = [m.prometheus for m in metrics.CATALOGUE if m.prometheus] + [s.name for s in metrics.FLEET_SERIES]
    assert len(names) == len(set(names))
    for name in names:
        assert PROMETHEUS_NAME.match(name) and name.startswith("stare_"), name
    for metric in metrics.CATALOGUE:
        assert metric.unit and metric.help, metric.key
        assert (metric.prometheus is not None) == (metrics.Surface.PROMETHEUS in metric.shown)


def test_an_unknown_key_or_series_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown metric 'entropy/nope'"):
        metrics.get("entropy/nope")
    with pytest.raises(ValueError, match="unknown fleet series 'stare_nope'"):
        metrics.fleet_series("stare_nope")


def _batch() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    logprob = -torch.rand(4, 6, generator=g) * 3
    return {
        "logprob": logprob.requires_grad_(),
        "old_logprob": logprob.detach() - 0.05,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        "response_mask": torch.ones(4, 6),
        "entropy": torch.rand(4, 6, generator=g) + 0.5,
        "ref_logprob": logprob.detach() - 0.1,
    }


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_key_a_loss_emits_is_catalogued(name: str) -> None:
    from contract.algorithms import make_loss_params
    from trainer.algos import PolicyLossInputs, compute_policy_loss

    params = make_loss_params(name, kl_beta=0.1)
    _, emitted = compute_policy_loss(name, PolicyLossInputs(**_batch()), params)
    # tokens/active weighs the micro-batches' metrics and is not emitted (trainer.engine.policy_update).
    keys = set(emitted) - {"tokens/active"}
    assert keys and keys <= set(metrics.METRICS), sorted(keys - set(metrics.METRICS))


@pytest.mark.parametrize("estimator", ADVANTAGE_ESTIMATOR_NAMES)
def test_the_advantage_and_quadrant_keys_are_catalogued(estimator: str) -> None:
    from trainer.algos import compute_advantages, quadrant_analysis

    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    advantages, emitted = compute_advantages(estimator, rewards, torch.tensor([0, 0, 1, 1]))
    batch = _batch()
    emitted |= quadrant_analysis(
        advantages, batch["logprob"].detach(), batch["entropy"], -torch.rand(4, 6), batch["response_mask"]
    )
    assert set(emitted) <= set(metrics.METRICS), sorted(set(emitted) - set(metrics.METRICS))


def test_the_exporter_publishes_the_catalogues_prometheus_metrics() -> None:
    from worker import metrics as exporter

    published = {m.key: m.prometheus for m in exporter.JOB_METRICS}
    assert published == {m.key: m.prometheus for m in metrics.CATALOGUE if m.prometheus}
    # Step metrics come from the job's latest step, eval metrics (avg@k, pass@k) from its latest evaluation.
    assert {m.key for m in exporter.EVAL_METRICS} == {"eval/avg@k", "eval/pass@k"}
    assert {m.key for m in exporter.STEP_METRICS} | {m.key for m in exporter.EVAL_METRICS} == set(published)
    assert all(metrics.get(m.key).event is EventType.STEP for m in exporter.STEP_METRICS)


BAND_CASES = [
    (0.05, BandState.BELOW),
    (0.1, BandState.IN_BAND),
    (0.5, BandState.IN_BAND),
    (1.0, BandState.IN_BAND),
    (1.5, BandState.ABOVE),
]


@pytest.mark.parametrize(("entropy", "state"), BAND_CASES)
def test_the_band_state_of_an_entropy_includes_the_edges(entropy: float, state: BandState) -> None:
    assert BandState.of(entropy, 0.1, 1.0) is state
    assert BandState.from_code(float(state.code)) is state
    assert BandState.from_label(state.label) is state


def test_a_logged_band_state_reads_by_its_sign_and_junk_is_refused() -> None:
    assert [BandState.from_code(v).label for v in (-0.5, -0.0, 0, 2.0)] == [
        "below",
        "in_band",
        "in_band",
        "above",
    ]
    for junk in (float("nan"), None, "1", True):
        with pytest.raises(ValueError, match="band state"):
            BandState.from_code(junk)
    with pytest.raises(ValueError, match="unknown band state 'inside'"):
        BandState.from_label("inside")
