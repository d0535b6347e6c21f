"""`stare checkpoints` (list, download) and `stare report`: what a job leaves behind."""

from __future__ import annotations

import tempfile
import webbrowser
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
from rich.table import Table

from stare_client.cli.common import (
    JobArg,
    Output,
    OutputOpt,
    app,
    checkpoints_app,
    client,
    emit_json,
    err,
    fmt,
    out,
)
from stare_client.cli.notes import show_report_notes

# ------------------------------------------------------------------------------------------ checkpoints


@checkpoints_app.command("list")
def checkpoints_list(job_id: JobArg, output: OutputOpt = Output.table) -> None:
    """A job's checkpoints with their step's metrics."""
    with client() as stare:
        found = stare.checkpoints.list(job_id)
    if output is Output.json:
        emit_json(found)
        return
    table = Table()
    for column in ("id", "step", "MB", "entropy", "reward", "created"):
        table.add_column(column)
    for c in found:
        metrics = c.metrics or {}
        table.add_row(
            c.id,
            str(c.step),
            fmt(c.bytes / 1e6 if c.bytes else None, 1),
            fmt(metrics.get("entropy/mean")),
            fmt(metrics.get("reward/mean")),
            f"{c.created_at:%Y-%m-%d %H:%M:%S}",
        )
    out.print(table)


@checkpoints_app.command("download")
def checkpoints_download(
    job_id: JobArg,
    which: Annotated[
        str, typer.Argument(help="latest, best (held-out avg@k), a step or a checkpoint id.")
    ] = "latest",
    to: Annotated[Path | None, typer.Option("--to", help="Target folder (default ./<job>-step-N).")] = None,
    merged: Annotated[
        bool, typer.Option("--merged", help="LoRA: the merged model instead of the adapter.")
    ] = False,
    base_model: Annotated[
        str | None, typer.Option("--base-model", help="LoRA --merged: the base model to merge into.")
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an existing target folder.")
    ] = False,
    model_only: Annotated[
        bool,
        typer.Option(
            "--model-only", help="Only model/ (and adapter/): what loads, without the training state."
        ),
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Download, verify (SHA-256) and unpack a checkpoint; prints the folder from_pretrained loads."""
    selector: Any = int(which) if which.isdigit() else which
    with client() as stare:
        bar = Progress(
            TextColumn("download"),
            BarColumn(),
            TaskProgressColumn(),
            console=err,
            disable=output is Output.json,
        )
        with bar:
            task = bar.add_task("download", total=None)
            got = stare.checkpoints.download(
                job_id,
                selector,
                to,
                merged=merged,
                base_model=base_model,
                overwrite=overwrite,
                model_only=model_only,
                progress=lambda done, total: bar.update(task, completed=done, total=total or None),
            )
    info = {
        "path": str(got.path),
        "root": str(got.root),
        "kind": got.kind,
        "job_id": got.job_id,
        "checkpoint_id": got.checkpoint_id,
        "step": got.step,
        "sha256": got.sha256,
    }
    if output is Output.json:
        emit_json(info)
    else:
        out.print(f"step {got.step} ({got.kind}, sha256 {got.sha256[:12]}…) → {got.path}")


# ----------------------------------------------------------------------------------------------- report


@app.command("report")
def report(
    job_id: JobArg,
    html: Annotated[Path | None, typer.Option("--html", help="Save the HTML report to this file.")] = None,
    open_: Annotated[bool, typer.Option("--open", help="Open the HTML report in a browser.")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """A job's evaluation report: avg@k and pass@k before and after RL, entropy, gate, reward."""
    with client() as stare:
        rep = stare.reports.get(job_id)
        saved = None
        if html is not None or open_:
            target = html or Path(tempfile.gettempdir()) / f"stare-report-{job_id}.html"
            saved = stare.reports.save_html(job_id, target)
    if output is Output.json:
        emit_json(rep)
    else:
        table = Table(show_header=False, box=None)
        table.add_column(style="bold")
        table.add_column()
        ev = rep.evaluation
        table.add_row("job", f"{job_id} ({rep.job.algorithm} on {rep.job.model}, {rep.job.status})")
        table.add_row("steps", f"{rep.job.steps_done}/{rep.job.total_steps}")
        if ev.before is not None:
            table.add_row(f"avg@{ev.k} before (step {ev.before.step})", fmt(ev.before.avg_at_k))
        if ev.after is not None:
            table.add_row(f"avg@{ev.k} after (step {ev.after.step})", fmt(ev.after.avg_at_k))
        table.add_row(
            "entropy last / mean", f"{fmt(rep.entropy.get('last'))} / {fmt(rep.entropy.get('mean'))}"
        )
        table.add_row("fraction in band", fmt(rep.entropy.get("fraction_in_band")))
        table.add_row("gate on fraction", fmt(rep.gate.get("on_fraction")))
        out.print(table)
        show_report_notes(rep)
    if saved is not None:
        err.print(f"HTML report: {saved}")
        if open_:
            webbrowser.open(saved.resolve().as_uri())
