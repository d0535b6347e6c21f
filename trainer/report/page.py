"""The report's page: one self-contained HTML document (inline CSS and SVG, no script), `render_html`."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trainer.report.notes import notes_html
from trainer.report.page_charts import report_charts
from trainer.report.summary import (
    QUADRANT_LABELS,
    QUADRANTS,
)

# ---------------------------------------------------------------------------------------------- HTML


def _fmt(value: Any) -> str:
    """A number for a table cell: thousands separated from 1000 up, else 4 significant digits."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        text = f"{value:.4g}"
        return text if any(c in text for c in ".en") else f"{text}.0"  # 1.0, not 1, next to 0.36
    return html.escape(str(value))


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _signed(value: float | None, *, judged: bool = True) -> str:
    """A signed delta, green when up and red when down if `judged` (a longer response is neither)."""
    if value is None:
        return '<span class="muted">—</span>'
    tone = "flat" if value == 0 or not judged else "good" if value > 0 else "bad"
    return f'<span class="delta {tone}">{"+" if value > 0 else ""}{_fmt(value)}</span>'


def _muted(text: str) -> str:
    return f' <span class="muted">{text}</span>'


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    hours, rest = divmod(round(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def _rows(pairs: Iterable[tuple[str, str]]) -> str:
    return "".join(f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>" for k, v in pairs)


def _tile(label: str, value: str, note: str) -> str:
    return (
        f'<div class="tile"><div class="tile-label">{html.escape(label)}</div>'
        f'<div class="tile-value">{value}</div><div class="tile-note">{note}</div></div>'
    )


def _status(status: str) -> str:
    return f'<span class="status status-{html.escape(status)}">{html.escape(status)}</span>'


def _k(report: Mapping[str, Any]) -> str:
    return "k" if (k := report["evaluation"]["k"]) is None else str(k)


def _title(job: Mapping[str, Any]) -> str:
    return str(job["name"] or f"{job['algorithm'] or 'RL'} run")


_STATE_TEXT = {"in_band": "in band", "below": "below the band", "above": "above the band"}


def _job_rows(job: Mapping[str, Any]) -> list[tuple[str, str]]:
    done, total = job["steps_done"], job["total_steps"]
    progress = min(1.0, done / total) if total else 0.0
    bar = f'<span class="bar"><span style="width:{progress * 100:.1f}%"></span></span>'
    checkpoints = job["checkpoints"]
    last = checkpoints[-1] if checkpoints else None
    rows = [
        (
            "Algorithm",
            _fmt(job["algorithm"])
            + (_muted(f"advantage: {_fmt(job['advantage'])}") if job["advantage"] else ""),
        ),
        ("Model", _fmt(job["model"])),
        ("Status", _status(str(job["status"]))),
        ("Steps", f"{_fmt(done)} / {_fmt(total)} {bar}"),
        ("Started", _fmt(job["started_at"])),
        ("Finished", _fmt(job["finished_at"])),
        ("Duration", _duration(job["duration_s"])),
        ("Resumes", _fmt(job["resumes"])),
        (
            "Checkpoints",
            str(len(checkpoints))
            + (
                _muted(f"last at step {last['step']}: <code>{html.escape(last['path'])}</code>")
                if last
                else ""
            ),
        ),
    ]
    if job["error"]:
        rows.append(("Error", f'<span class="error">{html.escape(job["error"])}</span>'))
    return rows


def _header_html(report: Mapping[str, Any]) -> str:
    job, ev, ent, gate = report["job"], report["evaluation"], report["entropy"], report["gate"]
    after, k = ev["after"] or {}, _k(report)
    vs_start = " vs step 0"
    tiles = [
        _tile(f"avg@{k} after RL", _fmt(after.get("avg_at_k")), _signed(ev["delta"]["avg_at_k"]) + vs_start),
        _tile(
            f"pass@{k} after RL", _fmt(after.get("pass_at_k")), _signed(ev["delta"]["pass_at_k"]) + vs_start
        ),
        _tile(
            "entropy (last step)", _fmt(ent["last"]), _STATE_TEXT.get(ent["last_state"] or "", "not logged")
        ),
        _tile(
            "steps in band",
            _pct(ent["fraction_in_band"]),
            f"longest excursion: {_count(ent['longest_out_of_band_run'], 'step')}",
        ),
        _tile(
            "time to collapse",
            f"step {ent['collapse_step']:,}" if ent.get("collapse_step") else "none",
            "held ±25 % of target: " + _pct(ent.get("target_hold_fraction")),
        ),
        _tile(
            "STARE gate on",
            _pct(gate["on_fraction"]),
            f"{gate['on_steps']:,} of {_count(gate['steps_logged'], 'step')}"
            if gate["steps_logged"]
            else "not logged",
        ),
    ]
    subtitle = " · ".join(html.escape(str(v)) for v in (job["algorithm"], job["model"]) if v)
    return (
        f'<header><div class="kicker">Evaluation report</div><h1>{html.escape(_title(job))}</h1>'
        f'<p class="sub">{subtitle + " · " if subtitle else ""}{_status(str(job["status"]))}</p></header>'
        f'<section class="tiles">{"".join(tiles)}</section>'
        f'<section class="card"><h2>Job</h2><table class="kv">{_rows(_job_rows(job))}</table></section>'
    )


def _evaluation_html(report: Mapping[str, Any]) -> str:
    ev, train = report["evaluation"], report["response_length"]["train"]
    before, after, delta, k = ev["before"] or {}, ev["after"] or {}, ev["delta"], _k(report)
    rows = "".join(
        f"<tr><th>{label}</th><td>{_fmt(before.get(key))}</td><td>{_fmt(after.get(key))}</td>"
        f"<td>{_signed(delta[key], judged=judged)}</td></tr>"
        for label, key, judged in (
            (f"avg@{k}", "avg_at_k", True),
            (f"pass@{k}", "pass_at_k", True),
            ("response length (tokens)", "response_length", False),
        )
    )
    notes = []
    prompts = after.get("num_prompts") or before.get("num_prompts")
    if prompts is not None:
        notes.append(f"Evaluated on {_count(prompts, 'prompt')} with k = {html.escape(k)} samples each.")
    if train["first"] is not None:
        notes.append(
            f"Training responses: {_fmt(train['first'])} tokens at the first step, {_fmt(train['last'])} "
            f"at the last (mean {_fmt(train['mean'])})."
        )
    after_head = f"after (step {after['step']})" if after else "after"
    return (
        '<section class="card"><h2>Evaluation before and after RL</h2><table class="num"><thead><tr><th></th>'
        f"<th>before (step 0)</th><th>{after_head}</th><th>Δ</th></tr></thead><tbody>{rows}</tbody></table>"
        + (f'<p class="note">{" ".join(notes)}</p>' if notes else "")
        + "</section>"
    )


def _entropy_rows(ent: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The Entropy card's rows: the range, the band and the time in it, collapse and holding."""
    band = "—" if ent["band_low"] is None else f"[{_fmt(ent['band_low'])}, {_fmt(ent['band_high'])}] nats"
    return [
        ("First / last", f"{_fmt(ent['first'])} / {_fmt(ent['last'])}"),
        (
            "Min",
            _fmt(ent["min"]) + (_muted(f"at step {ent['min_step']}") if ent["min_step"] is not None else ""),
        ),
        (
            "Max",
            _fmt(ent["max"]) + (_muted(f"at step {ent['max_step']}") if ent["max_step"] is not None else ""),
        ),
        ("Band", band),
        (
            "Steps in band",
            _pct(ent["fraction_in_band"])
            + (
                _muted(f"({ent['steps_in_band']:,} of {ent['steps_with_state']:,})")
                if ent["steps_with_state"]
                else ""
            ),
        ),
        ("Steps below / above", f"{ent['steps_below']:,} / {ent['steps_above']:,}"),
        ("Longest out-of-band run", _count(ent["longest_out_of_band_run"], "step")),
        (
            "Time to collapse",
            f"step {ent['collapse_step']:,}" if ent.get("collapse_step") else "not collapsed",
        ),
        (
            "Post-gate steps within ±25 % of the target",
            _pct(ent.get("target_hold_fraction"))
            + _muted(f"(of {_count(ent.get('post_gate_steps') or 0, 'step')})")
            if ent.get("target_hold_fraction") is not None
            else "no post-gate steps",
        ),
        (
            "5-step mean within ±25 % of the target",
            _pct(ent.get("ma_hold_fraction"))
            + _muted(
                f"(from step {ent['settling_step']:,}; mean |H − H*|/H* {_fmt(ent.get('mean_abs_deviation'))})"
            )
            if ent.get("settling_step") is not None
            else "not settled",
        ),
        ("Current out-of-band run", _count(ent["current_out_of_band_run"], "step")),
    ]


def _gate_card(report: Mapping[str, Any]) -> str:
    """The STARE gate card: the gate's rows, the controller's (if any) and the final quadrants."""
    gate, quads = report["gate"], report["quadrants"]
    gate_on = (
        _pct(gate["on_fraction"])
        + _muted(
            f"({gate['on_steps']:,} of {_count(gate['steps_logged'], 'step')}, "
            f"{_count(gate['toggles'], 'toggle')})"
        )
        if gate["steps_logged"]
        else "not logged"
    )
    gate_rows = [
        ("Gate on", gate_on),
        ("Target entropy", "—" if gate["target_entropy"] is None else f"{_fmt(gate['target_entropy'])} nats"),
        ("Final W / M", f"{_fmt(gate['final_w'])} / {_fmt(gate['final_m'])}"),
    ]
    quad_rows = "".join(
        f"<tr><th>{html.escape(QUADRANT_LABELS[q])}</th><td>{_pct(quads['fractions'][q])}</td>"
        f"<td>{_fmt(quads['drift'][q])}</td></tr>"
        for q in QUADRANTS
    )
    quad_step = f" (step {quads['step']})" if quads["step"] is not None else ""
    return (
        f'<div class="card"><h2>STARE gate</h2><table class="kv">{_rows(gate_rows)}</table>'
        f"{_controller_html(report.get('controller'))}"
        f'<h3>Final quadrants{quad_step}</h3><table class="num"><thead><tr><th></th><th>tokens</th>'
        f"<th>predicted drift</th></tr></thead><tbody>{quad_rows}</tbody>"
        "<tfoot><tr><th>total predicted drift</th>"
        f"<td></td><td>{_fmt(quads['predicted_drift'])}</td></tr></tfoot></table></div>"
    )


def _entropy_html(report: Mapping[str, Any]) -> str:
    return (
        '<section class="cols"><div class="card"><h2>Entropy</h2>'
        f'<table class="kv">{_rows(_entropy_rows(report["entropy"]))}</table></div>'
        f"{_gate_card(report)}</section>"
    )


def _controller_html(ctl: Mapping[str, Any] | None) -> str:
    """The PI law's rows (docs/ALGORITHMS.md §11); nothing for a job without one."""
    if not ctl or not ctl.get("steps_logged"):
        return ""
    rows = [
        (
            "Output u / error e / integral I",
            " / ".join(_fmt(ctl[k]) for k in ("final_output", "final_error", "final_integral")),
        ),
        ("Actuator (α, W or ε_high)", _fmt(ctl["final_actuator"])),
        (
            "Steps at the clip",
            _pct(ctl["saturated_fraction"])
            + _muted(f"(longest run {_count(ctl['longest_saturated_run'] or 0, 'step')})"),
        ),
    ]
    if ctl.get("saturated"):
        rows.append(
            (
                "Saturated",
                f"at its clip for the last {_count(ctl['final_saturated_steps'], 'step')}: the target cannot "
                "be held with this actuator",
            )
        )
    return f'<h3>Entropy controller (PI law, last step)</h3><table class="kv">{_rows(rows)}</table>'


def _history_html(report: Mapping[str, Any]) -> str:
    history, k = report["evaluation"]["history"], _k(report)
    if not history:
        return (
            '<section class="card"><h2>Evaluation history</h2><p class="muted">No evaluation yet.</p>'
            "</section>"
        )
    rows = "".join(
        f"<tr><td>{r['step']}</td><td>{_fmt(r['avg_at_k'])}</td><td>{_fmt(r['pass_at_k'])}</td>"
        f"<td>{_fmt(r['k'])}</td><td>{_fmt(r['response_length'])}</td><td>{_fmt(r['num_prompts'])}</td></tr>"
        for r in history
    )
    return (
        '<section class="card"><h2>Evaluation history</h2><table class="num grid"><thead><tr><th>step</th>'
        f"<th>avg@{html.escape(k)}</th><th>pass@{html.escape(k)}</th><th>k</th><th>response length</th>"
        f"<th>prompts</th></tr></thead><tbody>{rows}</tbody></table></section>"
    )


# The stylesheet stands in one place, report.css beside this module: inlined into every report (a report is
# one self-contained file) and linked by the results pages (experiments/page.py).
CSS_FILE = Path(__file__).with_name("report.css")
_CSS = CSS_FILE.read_text(encoding="utf-8")


def render_html(report: Mapping[str, Any]) -> str:
    """The self-contained page for a report from build_report (inline CSS and SVG; no script, no link)."""
    job = report["job"]
    plots = "".join(
        f'<section class="card"><figure><h2>{html.escape(name)}</h2><figcaption>{html.escape(caption)}'
        f"</figcaption>{svg}</figure></section>"
        for name, caption, svg in report_charts(report)
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>Report · {html.escape(_title(job))}</title><style>{_CSS}</style></head><body><main>"
        f"{_header_html(report)}{_evaluation_html(report)}{notes_html(report)}{_entropy_html(report)}"
        f"{plots}{_history_html(report)}"
        f"<footer>stare-rl report v{report['report_version']} · built from {job['events']} events</footer>"
        "</main></body></html>\n"
    )
