"""The report's samples and warnings (contract.samples, contract.warnings): folded from the `samples` and
`warning` events (`fold_notes`: the first and the last evaluation's samples, the latest training ones, the
latest warning of each kind) and shown on the page (`notes_html`) above the charts."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

from contract.samples import checked_samples


def fold_notes(events: Iterable[Any]) -> dict[str, Any]:
    """{"samples": {eval_first, eval_last, train_last: {step, samples} | None}, "warnings": [...]} from the
    event stream; a step's samples written twice (a resumed run) keep the last."""
    by_phase: dict[str, dict[int, list[dict[str, Any]]]] = {"eval": {}, "train": {}}
    warnings: dict[str, dict[str, Any]] = {}
    for event in events:
        if not isinstance(event, Mapping) or not isinstance(event.get("step"), int):
            continue
        if event.get("type") == "samples" and event.get("phase") in by_phase:
            by_phase[str(event["phase"])][event["step"]] = checked_samples(event.get("samples"))
        elif event.get("type") == "warning" and isinstance(event.get("kind"), str):
            warnings[event["kind"]] = {
                k: event.get(k) for k in ("kind", "message", "step", "count", "first_step")
            }

    def at(phase: str, pick: Any) -> dict[str, Any] | None:
        steps = by_phase[phase]
        if not steps:
            return None
        step = pick(steps)
        return {"step": step, "samples": steps[step]}

    samples = {"eval_first": at("eval", min), "eval_last": at("eval", max), "train_last": at("train", max)}
    return {"samples": samples, "warnings": sorted(warnings.values(), key=lambda w: str(w["kind"]))}


def _sample_rows(samples: list[dict[str, Any]]) -> str:
    rows = []
    for s in samples:
        cut = ' <span class="muted">(cut at max_new_tokens)</span>' if s.get("truncated") else ""
        rows.append(
            f"<tr><td><pre>{html.escape(str(s.get('prompt', '')))}</pre></td>"
            f"<td><pre>{html.escape(str(s.get('completion', '')))}</pre>{cut}</td>"
            f"<td><pre>{html.escape(str(s.get('reference') or '—'))}</pre></td>"
            f"<td>{float(s.get('reward') or 0.0):.3g}</td></tr>"
        )
    return "".join(rows)


def _samples_table(title: str, entry: Mapping[str, Any] | None) -> str:
    if not entry or not entry.get("samples"):
        return ""
    return (
        f"<h3>{html.escape(title)} (step {int(entry['step'])})</h3>"
        '<table class="samples"><thead><tr><th>prompt</th><th>completion</th><th>reference</th>'
        f"<th>reward</th></tr></thead><tbody>{_sample_rows(list(entry['samples']))}</tbody></table>"
    )


def notes_html(report: Mapping[str, Any]) -> str:
    """The warnings card (what to change) and the samples card; empty where the report has neither."""
    warnings = report.get("warnings") or []
    out = ""
    if warnings:
        items = "".join(
            f"<li><b>{html.escape(str(w['kind']))}</b> (steps {w.get('first_step')}–{w.get('step')}, "
            f"{w.get('count')}×): {html.escape(str(w.get('message', '')))}</li>"
            for w in warnings
        )
        out += f'<section class="card warnings"><h2>Warnings</h2><ul>{items}</ul></section>'
    samples = report.get("samples") or {}
    first, last = samples.get("eval_first"), samples.get("eval_last")
    tables = _samples_table("Evaluation, first", first)
    if last and (not first or last["step"] != first["step"]):
        tables += _samples_table("Evaluation, last", last)
    tables += _samples_table("Training", samples.get("train_last"))
    if tables:
        out += f'<section class="card"><h2>Sample completions</h2>{tables}</section>'
    return out
