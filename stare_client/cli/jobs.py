"""`stare jobs`: submit, list, get, cancel, pause, resume, delete, watch and compare training jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, ProgressColumn, TaskProgressColumn, TextColumn
from rich.table import Table

from stare_client import errors, models
from stare_client.cli.common import (
    JOB_EXIT,
    Exit,
    JobArg,
    Output,
    OutputOpt,
    client,
    emit_json,
    err,
    fail,
    fmt,
    jobs_app,
    load_submission,
    out,
)
from stare_client.cli.notes import print_warnings, show_notes
from stare_client.client import Client

# ------------------------------------------------------------------------------------------------- jobs


def job_table(jobs: list[models.Job]) -> Table:
    """One row per job. A job id is never cut (scripts and people copy it): its column keeps its width, and
    on a narrow terminal the other columns fold their text onto more lines instead."""
    table = Table(show_lines=False)
    table.add_column("id", no_wrap=True, min_width=max((len(job.id) for job in jobs), default=2))
    for column in ("status", "algorithm", "model", "step", "entropy", "created"):
        table.add_column(column, overflow="fold")
    for job in jobs:
        table.add_row(
            job.id,
            job_status_text(job),
            job.algorithm,
            job.model,
            f"{job.progress.step}/{job.progress.total_steps}",
            entropy_text(job),
            job.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    return table


STATUS_STYLE = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "paused": "cyan"}


def status_text(status: str) -> str:
    style = STATUS_STYLE.get(status)
    return f"[{style}]{status}[/]" if style else status


def job_status_text(job: models.Job) -> str:
    """The status, and for a job that no live worker can take, why it waits (never a bare `queued`)."""
    if job.waiting is None:
        return status_text(job.status)
    return f"{status_text(job.status)} [red]waiting: {escape(job.waiting.message)}[/]"


BAND_STYLE = {"in_band": "green", "below": "red", "above": "yellow"}


def entropy_text(job: models.Job) -> str:
    e = job.entropy
    if e.value is None:
        return "-"
    band = f" [{fmt(e.band.low, 2)}, {fmt(e.band.high, 2)}]" if e.band.low is not None else ""
    style = BAND_STYLE.get(e.state or "", "white")
    return f"[{style}]{e.value:.3f} {e.state or ''}[/]{band}"


def control_text(control: models.ControlStatus | None) -> str | None:
    """The PI entropy law's line (law, target, u, e, I, actuator, steps at the clip); None without a law."""
    if control is None:
        return None
    text = (
        f"{control.law}: target {fmt(control.target)} · u {fmt(control.output)} · e {fmt(control.error)} · "
        f"I {fmt(control.integral)} · actuator {fmt(control.actuator)}"
    )
    if control.saturated_steps:
        text += f" · at its clip {control.saturated_steps} steps"
    if control.saturated:
        text += " [red]saturated: the target cannot be held with this actuator[/]"
    return text


def show_job(job: models.Job) -> None:
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    p = job.progress
    rows = [
        ("id", job.id),
        ("status", job_status_text(job)),
        ("name", job.name or "-"),
        ("algorithm / model", f"{job.algorithm} / {job.model}"),
        ("progress", f"step {p.step}/{p.total_steps} ({p.fraction:.0%})"),
        ("eta", f"{p.eta_seconds:.0f} s" if p.eta_seconds is not None else "-"),
        ("entropy", entropy_text(job)),
        *([("controller", ctl)] if (ctl := control_text(job.control)) is not None else []),
        ("attempt", f"{job.attempt} (failures {job.failures}/{job.max_attempts})"),
        ("created / finished", f"{job.created_at:%Y-%m-%d %H:%M:%S} / {job.finished_at or '-'}"),
    ]
    if job.disk_bytes is not None:
        rows.append(("disk", f"{job.disk_bytes / 1e6:,.1f} MB on the server"))
    if job.error is not None:
        rows.append(("error", f"[red]{job.error.code}[/]: {job.error.message}"))
    for name, value in rows:
        table.add_row(name, value)
    out.print(table)
    show_notes(job)


@jobs_app.command("submit")
def jobs_submit(
    spec_file: Annotated[Path, typer.Argument(help="A YAML job spec (trainer/specs/demo.yaml is one).")],
    watch: Annotated[
        bool, typer.Option("--watch", help="Follow the job to its end (exit code = outcome).")
    ] = False,
    idempotency_key: Annotated[
        str | None, typer.Option("--idempotency-key", help="Retry-safe submission (default: a fresh key).")
    ] = None,
    training_file: Annotated[str | None, typer.Option("--training-file", help="An uploaded file id.")] = None,
    timeout: Annotated[
        float | None, typer.Option(help="With --watch: give up after this many seconds.")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Validate and submit a job spec."""
    body = load_submission(spec_file)
    with client() as stare:
        job = stare.jobs.create(
            body["spec"],
            training_file=training_file or body.get("training_file"),
            metadata=body.get("metadata"),
            idempotency_key=idempotency_key,
        )
        if not watch:
            emit_json(job) if output is Output.json else out.print(f"submitted {job.id} ({job.status})")
            if output is not Output.json:
                print_warnings(job.warnings)
            return
        if output is not Output.json:
            out.print(f"submitted {job.id}")
            print_warnings(job.warnings)
        watch_job(stare, job.id, output, timeout)


@jobs_app.command("list")
def jobs_list(
    status: Annotated[
        str | None, typer.Option(help="Only jobs in this state (running, succeeded, ...).")
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many jobs (newest first).", min=1)] = 20,
    output: OutputOpt = Output.table,
) -> None:
    """This tenant's jobs, newest first."""
    with client() as stare:
        found: list[models.Job] = []
        for job in stare.jobs.list(status=status, page_size=min(limit, 100)):
            found.append(job)
            if len(found) >= limit:
                break
    if output is Output.json:
        emit_json(found)
    else:
        out.print(job_table(found))


@jobs_app.command("get")
def jobs_get(job_id: JobArg, output: OutputOpt = Output.table) -> None:
    """A job's status, progress, entropy and error."""
    with client() as stare:
        job = stare.jobs.get(job_id)
    emit_json(job) if output is Output.json else show_job(job)


def _action(job_id: str, action: str, output: Output) -> None:
    with client() as stare:
        job = getattr(stare.jobs, action)(job_id)
    if output is Output.json:
        emit_json(job)
    else:
        out.print(f"{job.id}: {status_text(job.status)}")


@jobs_app.command("cancel")
def jobs_cancel(job_id: JobArg, output: OutputOpt = Output.table) -> None:
    """Cancel a job (a running one stops at its next step)."""
    _action(job_id, "cancel", output)


@jobs_app.command("pause")
def jobs_pause(job_id: JobArg, output: OutputOpt = Output.table) -> None:
    """Pause a job (a running one checkpoints first)."""
    _action(job_id, "pause", output)


@jobs_app.command("resume")
def jobs_resume(job_id: JobArg, output: OutputOpt = Output.table) -> None:
    """Resume a paused job (or one that failed on a system fault)."""
    _action(job_id, "resume", output)


@jobs_app.command("delete")
def jobs_delete(job_id: JobArg, output: OutputOpt = Output.table) -> None:
    """Delete a finished job with everything it stored."""
    with client() as stare:
        deleted = stare.jobs.delete(job_id)
    emit_json(deleted) if output is Output.json else out.print(f"deleted {deleted.id}")


def _gate(job: models.Job) -> str:
    values = job.latest_metrics.values if job.latest_metrics else {}
    gate = values.get("stare/gate_on")
    if gate is None:
        return "gate -"
    return "[magenta]gate on[/]" if gate >= 0.5 else "gate off"


def _reward(job: models.Job) -> str:
    values = job.latest_metrics.values if job.latest_metrics else {}
    reward = values.get("reward/mean")
    return f"reward {fmt(reward)}"


def _eta(job: models.Job) -> str:
    eta = job.progress.eta_seconds
    if eta is None:
        return "eta -"
    minutes, seconds = divmod(int(eta), 60)
    return f"eta {minutes}:{seconds:02d}"


WIDE_WATCH = 110  # columns from which the bar also shows the gate and the reward


def watch_columns(width: int) -> list[ProgressColumn]:
    """The live bar's columns for a terminal `width` wide: below WIDE_WATCH a shorter bar and no gate or
    reward, so that status, step, ETA and entropy fit whole in 80 columns."""
    wide = width >= WIDE_WATCH
    columns: list[ProgressColumn] = [
        TextColumn("{task.fields[status]}"),
        BarColumn(bar_width=20 if wide else 8),
        TaskProgressColumn(),
        TextColumn("{task.fields[steps]}"),
        TextColumn("{task.fields[eta]}"),
        TextColumn("entropy {task.fields[entropy]}"),
    ]
    if wide:
        columns += [TextColumn("{task.fields[gate]}"), TextColumn("{task.fields[reward]}")]
    return columns


def watch_job(
    stare: Client, job_id: str, output: Output, timeout: float | None, poll_s: float = 1.0
) -> NoReturn:
    """Follow a job with a live bar until it is terminal or paused; exit with the outcome's code."""
    quiet = output is Output.json
    console = err if quiet else out
    progress = Progress(*watch_columns(console.width), console=console, disable=quiet)

    def update(job: models.Job) -> None:
        progress.update(
            task,
            completed=job.progress.step,
            total=max(job.progress.total_steps, 1),
            status=job_status_text(job),
            steps=f"step {job.progress.step}/{job.progress.total_steps}",
            eta=_eta(job),
            entropy=entropy_text(job),
            gate=_gate(job),
            reward=_reward(job),
        )

    with progress:
        task = progress.add_task(
            job_id, total=None, status="…", steps="", eta="", entropy="-", gate="", reward=""
        )
        try:
            job = stare.jobs.wait(job_id, timeout=timeout, poll_s=poll_s, on_update=update)
        except errors.WaitTimeout as exc:
            progress.stop()
            if quiet:
                emit_json(exc.job)
            fail(str(exc), Exit.WATCH_TIMEOUT)
    if quiet:
        emit_json(job)
    else:
        line = f"{job.id}: {job_status_text(job)}"
        if job.error is not None:
            line += f" — {job.error.code}: {job.error.message}"
        out.print(line)
    raise typer.Exit(JOB_EXIT.get(job.status, Exit.ERROR))


@jobs_app.command("watch")
def jobs_watch(
    job_id: JobArg,
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds (exit 13).")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """A live progress bar: step/total, ETA, entropy against its band (green in, red below, yellow above),
    gate state and reward. Exits 0 when the job succeeds, 10 failed, 11 cancelled, 12 paused."""
    with client() as stare:
        watch_job(stare, job_id, output, timeout)


COMPARE_ROWS: list[tuple[str, Any]] = [
    ("status", lambda j, r: j.status),
    ("algorithm", lambda j, r: j.algorithm),
    ("model", lambda j, r: j.model),
    ("steps", lambda j, r: f"{j.progress.step}/{j.progress.total_steps}"),
    ("k", lambda j, r: r.evaluation.k),
    ("avg@k before", lambda j, r: r.evaluation.before.avg_at_k if r.evaluation.before else None),
    ("avg@k after", lambda j, r: r.evaluation.after.avg_at_k if r.evaluation.after else None),
    ("avg@k delta", lambda j, r: r.evaluation.delta.get("avg_at_k")),
    ("pass@k after", lambda j, r: r.evaluation.after.pass_at_k if r.evaluation.after else None),
    ("entropy last", lambda j, r: r.entropy.get("last")),
    ("entropy mean", lambda j, r: r.entropy.get("mean")),
    ("fraction in band", lambda j, r: r.entropy.get("fraction_in_band")),
    ("gate on fraction", lambda j, r: r.gate.get("on_fraction")),
    ("reward mean", lambda j, r: (r.reward.get("mean") or {}).get("mean")),
    ("response length", lambda j, r: (r.response_length.get("train") or {}).get("mean")),
    ("duration s", lambda j, r: r.job.duration_s),
]


def compare_summary(job: models.Job, report: models.Report) -> dict[str, Any]:
    return {name: get(job, report) for name, get in COMPARE_ROWS}


@jobs_app.command("compare")
def jobs_compare(
    job_ids: Annotated[list[str], typer.Argument(help="Two or more job ids.")],
    output: OutputOpt = Output.table,
) -> None:
    """A side-by-side summary: evaluation before and after, entropy, gate, reward, length, duration."""
    with client() as stare:
        summaries = {jid: compare_summary(stare.jobs.get(jid), stare.reports.get(jid)) for jid in job_ids}
    if output is Output.json:
        emit_json(summaries)
        return
    table, legend = compare_table(summaries, job_ids, out.width)
    for line in legend:
        out.print(line)
    out.print(table)


def _k_label(name: str, ks: set[Any]) -> str:
    """`avg@k after` as `avg@4 after` when every job was evaluated with k = 4; with several k each value
    says its own (`_k_value`)."""
    if "@k" not in name or len(ks) != 1 or None in ks:
        return name
    return name.replace("@k", f"@{next(iter(ks))}")


def _k_value(name: str, value: Any, k: Any, ks: set[Any]) -> str:
    return f"{fmt(value)} (@{k})" if "@k" in name and len(ks) > 1 and value is not None else fmt(value)


def compare_table(
    summaries: dict[str, dict[str, Any]], job_ids: list[str], width: int
) -> tuple[Table, list[str]]:
    """The side-by-side table and, where the job ids do not fit as headers in `width` columns, a legend
    naming each column's job in full (`#1  job_...`): an id is never cut."""
    ks = {summaries[jid]["k"] for jid in job_ids}
    labels = [_k_label(name, ks) for name, _ in COMPARE_ROWS]
    label_width = max(map(len, labels))
    fits = label_width + 4 + sum(len(jid) + 3 for jid in job_ids) <= width
    headers = job_ids if fits else [f"#{n}" for n in range(1, len(job_ids) + 1)]
    legend = [] if fits else [f"{header}  {jid}" for header, jid in zip(headers, job_ids, strict=True)]
    table = Table()
    table.add_column("", no_wrap=True, min_width=label_width)
    for header in headers:
        table.add_column(header, justify="right", overflow="fold", min_width=len(header))
    for label, (name, _) in zip(labels, COMPARE_ROWS, strict=True):
        cells = [_k_value(name, summaries[jid][name], summaries[jid]["k"], ks) for jid in job_ids]
        table.add_row(label, *cells)
    return table, legend
