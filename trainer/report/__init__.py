"""The evaluation report of one run, built from its event stream (OUT/events.jsonl).

`build_report(events)` reduces the events to a JSON-serialisable dict: the job summary, evaluation before
and after RL training (avg@k, pass@k, response length, with deltas), the entropy summary against the band,
the STARE gate's duty cycle, the final quadrant token fractions and the per-step series that the page
plots. `write_report` writes report.json and a self-contained report.html (inline CSS and SVG, no script,
no external asset) next to each other, each atomically. `load_events` reads events.jsonl.

Its seams, one module each: summary (the numbers, `build_report`), charts (SVG, `line_chart_svg`), page
(HTML, `render_html`), files (`load_events`, `write_report`).

This package imports only the standard library: the HTTP service serves these files and never imports torch.
"""

from trainer.report.charts import BLUE, GREEN, GREY, ORANGE, PURPLE, VERMILION, Band, Trace, line_chart_svg
from trainer.report.files import load_events, write_report
from trainer.report.page import _CSS, CSS_FILE, render_html
from trainer.report.summary import REPORT_VERSION, SERIES_METRICS, build_report

__all__ = [
    "BLUE",
    "CSS_FILE",
    "GREEN",
    "GREY",
    "ORANGE",
    "PURPLE",
    "REPORT_VERSION",
    "SERIES_METRICS",
    "VERMILION",
    "_CSS",
    "Band",
    "Trace",
    "build_report",
    "line_chart_svg",
    "load_events",
    "render_html",
    "write_report",
]
