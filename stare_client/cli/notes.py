"""What `stare jobs get`, `stare jobs submit` and `stare report` print of a job's warnings and sample
completions, and `stare jobs events JOB [--follow]`: the job's event stream, one line an event."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import typer
from rich.markup import escape

from stare_client import models
from stare_client.cli.common import JobArg, Output, OutputOpt, client, jobs_app, out

TEXT_CHARS = 120  # a sample's text as one line of the terminal table


def _line(text: str | None, limit: int = TEXT_CHARS) -> str:
    flat = (text or "").replace("\n", "⏎")
    return escape(flat if len(flat) <= limit else flat[: limit - 1] + "…")


def print_warnings(warnings: Iterable[models.JobWarning]) -> None:
    """One paragraph a warning: its kind, the steps it held, and what to change."""
    for w in warnings:
        held = f" (steps {w.first_step}–{w.step}, {w.count}×)" if w.step is not None else ""
        out.print(f"[yellow]warning[/] [bold]{w.kind}[/]{held}: {escape(w.message)}")


def print_samples(title: str, found: models.SampleSet | None) -> None:
    """A sample set: prompt → completion (reference, reward), marked where cut at max_new_tokens."""
    if found is None or not found.samples:
        return
    out.print(f"[bold]{title} samples (step {found.step})[/]")
    for s in found.samples:
        cut = " [red]cut at max_new_tokens[/]" if s.truncated else ""
        out.print(f"  prompt:     {_line(s.prompt)}")
        out.print(f"  completion: {_line(s.completion)}{cut}")
        out.print(f"  reference:  {_line(s.reference)} · reward {s.reward:.3g}")


def show_notes(job: models.Job) -> None:
    """The job's warnings, then its latest evaluation and training samples."""
    print_warnings(job.warnings)
    if job.samples is not None:
        print_samples("evaluation", job.samples.eval)
        print_samples("training", job.samples.train)


def show_report_notes(report: models.Report) -> None:
    """A report's warnings and its first and last evaluation's and latest training samples."""
    print_warnings(report.warnings)
    first, last = report.samples.get("eval_first"), report.samples.get("eval_last")
    print_samples("evaluation (first)", first)
    if last is not None and (first is None or last.step != first.step):
        print_samples("evaluation (last)", last)
    print_samples("training", report.samples.get("train_last"))


def event_line(event: models.Event) -> str:
    """`#seq time type [step N] message`, with a step or evaluation event's headline metrics."""
    step = f" step {event.step}" if event.step is not None else ""
    style = {"warn": "yellow", "error": "red"}.get(event.level, "")
    text = f"#{event.id} {event.created_at:%H:%M:%S} {event.type}{step}: {escape(event.message)}"
    metrics = (event.data or {}).get("metrics")
    if isinstance(metrics, Mapping) and event.type in ("step.completed", "eval.completed"):
        text += " · " + ", ".join(f"{k} {_number(v)}" for k, v in metrics.items())
    return f"[{style}]{text}[/]" if style else text


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


@jobs_app.command("events")
def jobs_events(
    job_id: JobArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep streaming until the job has finished.")
    ] = False,
    after: Annotated[int, typer.Option(help="Only events after this sequence number.", min=0)] = 0,
    output: OutputOpt = Output.table,
) -> None:
    """A job's events, oldest first: its lifecycle, each step and evaluation (headline metrics),
    checkpoints, warnings and samples. With --follow, new ones as they come, until the job has finished."""
    with client() as stare:
        for event in stare.jobs.events(job_id, after=after, follow=follow):
            if output is Output.json:  # JSON Lines: one event a line, as it comes
                sys.stdout.write(event.model_dump_json() + "\n")
                sys.stdout.flush()
            else:
                out.print(event_line(event))
