"""`stare`: the command line over the Python client (typer, rich).

    stare jobs submit spec.yaml [--watch] [--idempotency-key K]
    stare jobs list|get|cancel|pause|resume|delete|watch|compare
    stare checkpoints list JOB | download JOB [latest|best|STEP|ID] [--to DIR] [--merged]
    stare report JOB [--html FILE] [--open]
    stare files upload PATH | list | delete ID
    stare keys create|list|revoke
    stare local up | down | demo

Every command takes `-o json` (machine-readable output on stdout). The connection comes from --url /
--api-key, else STARE_API_URL / STARE_API_KEY, else a local stack's `.stare/` (stare local up).

Exit codes (docs/CLIENT.md has the table): 0 done (a watched job succeeded); 1 an error the API or the
input caused (the one-line message names it); 2 a usage error; 3 the server cannot be reached; 4 the API key
was refused; 10 the watched job failed; 11 it was cancelled; 12 it is paused; 13 the watch timed out.
Errors are one line on stderr, never a traceback (STARE_DEBUG=1 shows it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import webbrowser
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import yaml
from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
from rich.table import Table

from stare_client import errors, models
from stare_client.client import Client
from stare_client.config import local_home


class Exit(IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    UNREACHABLE = 3
    AUTH = 4
    JOB_FAILED = 10
    JOB_CANCELLED = 11
    JOB_PAUSED = 12
    WATCH_TIMEOUT = 13


JOB_EXIT = {
    "succeeded": Exit.OK,
    "failed": Exit.JOB_FAILED,
    "cancelled": Exit.JOB_CANCELLED,
    "paused": Exit.JOB_PAUSED,
}


class Output(StrEnum):
    table = "table"
    json = "json"


app = typer.Typer(
    help="Drive the STARE training service: jobs, checkpoints, reports, files, API keys, a local stack.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
jobs_app = typer.Typer(help="Submit, follow and manage training jobs.", no_args_is_help=True)
checkpoints_app = typer.Typer(help="List and download a job's checkpoints.", no_args_is_help=True)
files_app = typer.Typer(help="Upload and manage JSONL datasets.", no_args_is_help=True)
keys_app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)
local_app = typer.Typer(
    help="The embedded stack on this machine (needs the full install).", no_args_is_help=True
)
app.add_typer(jobs_app, name="jobs")
app.add_typer(checkpoints_app, name="checkpoints")
app.add_typer(files_app, name="files")
app.add_typer(keys_app, name="keys")
app.add_typer(local_app, name="local")

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


class State:
    url: str | None = None
    api_key: str | None = None


STATE = State()

OutputOpt = Annotated[
    Output, typer.Option("--output", "-o", help="table (for people) or json (for scripts).")
]
JobArg = Annotated[str, typer.Argument(help="A job id (job_...).")]


@app.callback()
def _connection(
    url: Annotated[str | None, typer.Option("--url", help="The API's base URL (else STARE_API_URL).")] = None,
    api_key: Annotated[
        str | None, typer.Option("--api-key", help="An API key (else STARE_API_KEY).", show_default=False)
    ] = None,
) -> None:
    STATE.url, STATE.api_key = url, api_key


def client(max_retries: int = 3) -> Client:
    return Client(STATE.url, STATE.api_key, max_retries=max_retries, backoff_s=0.5)


def fail(message: str, code: int = Exit.ERROR) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    raise typer.Exit(code)


def emit_json(value: Any) -> None:
    if isinstance(value, BaseModel):
        text = value.model_dump_json(indent=2)
    else:
        text = json.dumps(
            value,
            indent=2,
            default=lambda v: v.model_dump(mode="json") if isinstance(v, BaseModel) else str(v),
        )
    sys.stdout.write(text + "\n")


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


# ------------------------------------------------------------------------------------------------ input


def load_submission(path: Path) -> dict[str, Any]:
    """The request body from a YAML file: a job spec (TrainSpec), or {spec, training_file?, metadata?}."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        fail(f"spec file {str(path)!r} not found")
    except OSError as exc:
        fail(f"cannot read spec file {str(path)!r}: {exc.strerror}")
    except UnicodeDecodeError:
        fail(f"spec file {str(path)!r} is not UTF-8 text")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        fail(f"spec file {str(path)!r} is not valid YAML{where}: {problem}")
    if data is None:
        fail(f"spec file {str(path)!r} is empty")
    if not isinstance(data, dict):
        fail(f"spec file {str(path)!r} must hold a mapping (the job spec), not a {type(data).__name__}")
    if "spec" in data and set(data) <= {"spec", "training_file", "metadata"}:
        return data
    return {"spec": data}


# ------------------------------------------------------------------------------------------------- jobs


def job_table(jobs: list[models.Job]) -> Table:
    table = Table(show_lines=False)
    for column in ("id", "status", "algorithm", "model", "step", "entropy", "created"):
        table.add_column(column)
    for job in jobs:
        table.add_row(
            job.id,
            status_text(job.status),
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


BAND_STYLE = {"in_band": "green", "below": "red", "above": "yellow"}


def entropy_text(job: models.Job) -> str:
    e = job.entropy
    if e.value is None:
        return "-"
    band = f" [{_fmt(e.band.low, 2)}, {_fmt(e.band.high, 2)}]" if e.band.low is not None else ""
    style = BAND_STYLE.get(e.state or "", "white")
    return f"[{style}]{e.value:.3f} {e.state or ''}[/]{band}"


def show_job(job: models.Job) -> None:
    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    p = job.progress
    rows = [
        ("id", job.id),
        ("status", status_text(job.status)),
        ("name", job.name or "-"),
        ("algorithm / model", f"{job.algorithm} / {job.model}"),
        ("progress", f"step {p.step}/{p.total_steps} ({p.fraction:.0%})"),
        ("eta", f"{p.eta_seconds:.0f} s" if p.eta_seconds is not None else "-"),
        ("entropy", entropy_text(job)),
        ("attempt", f"{job.attempt} (failures {job.failures}/{job.max_attempts})"),
        ("created / finished", f"{job.created_at:%Y-%m-%d %H:%M:%S} / {job.finished_at or '-'}"),
    ]
    if job.error is not None:
        rows.append(("error", f"[red]{job.error.code}[/]: {job.error.message}"))
    for name, value in rows:
        table.add_row(name, value)
    out.print(table)


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
            return
        if output is not Output.json:
            out.print(f"submitted {job.id}")
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
    return f"reward {_fmt(reward)}"


def _eta(job: models.Job) -> str:
    eta = job.progress.eta_seconds
    if eta is None:
        return "eta -"
    minutes, seconds = divmod(int(eta), 60)
    return f"eta {minutes}:{seconds:02d}"


def watch_job(
    stare: Client, job_id: str, output: Output, timeout: float | None, poll_s: float = 1.0
) -> NoReturn:
    """Follow a job with a live bar until it is terminal or paused; exit with the outcome's code."""
    quiet = output is Output.json
    progress = Progress(
        TextColumn("{task.fields[status]}"),
        BarColumn(bar_width=20),
        TaskProgressColumn(),
        TextColumn("{task.fields[steps]}"),
        TextColumn("{task.fields[eta]}"),
        TextColumn("entropy {task.fields[entropy]}"),
        TextColumn("{task.fields[gate]}"),
        TextColumn("{task.fields[reward]}"),
        console=err if quiet else out,
        disable=quiet,
    )

    def update(job: models.Job) -> None:
        progress.update(
            task,
            completed=job.progress.step,
            total=max(job.progress.total_steps, 1),
            status=status_text(job.status),
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
        line = f"{job.id}: {status_text(job.status)}"
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
    table = Table()
    table.add_column("")
    for jid in job_ids:
        table.add_column(jid, justify="right")
    for name, _ in COMPARE_ROWS:
        table.add_row(name, *(_fmt(summaries[jid][name]) for jid in job_ids))
    out.print(table)


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
            _fmt(c.bytes / 1e6 if c.bytes else None, 1),
            _fmt(metrics.get("entropy/mean")),
            _fmt(metrics.get("reward/mean")),
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
            table.add_row(f"avg@{ev.k} before (step {ev.before.step})", _fmt(ev.before.avg_at_k))
        if ev.after is not None:
            table.add_row(f"avg@{ev.k} after (step {ev.after.step})", _fmt(ev.after.avg_at_k))
        table.add_row(
            "entropy last / mean", f"{_fmt(rep.entropy.get('last'))} / {_fmt(rep.entropy.get('mean'))}"
        )
        table.add_row("fraction in band", _fmt(rep.entropy.get("fraction_in_band")))
        table.add_row("gate on fraction", _fmt(rep.gate.get("on_fraction")))
        out.print(table)
    if saved is not None:
        err.print(f"HTML report: {saved}")
        if open_:
            webbrowser.open(saved.resolve().as_uri())


# ------------------------------------------------------------------------------------------------ files


@files_app.command("upload")
def files_upload(
    path: Annotated[Path, typer.Argument(help="A JSONL file: {prompt, answer[, meta]} per line.")],
    purpose: Annotated[str, typer.Option(help="rl_train or rl_eval.")] = "rl_train",
    output: OutputOpt = Output.table,
) -> None:
    """Upload a dataset (checked line by line by the server)."""
    if not path.is_file():
        fail(f"file {str(path)!r} not found")
    with client() as stare:
        bar = Progress(
            TextColumn("upload"),
            BarColumn(),
            TaskProgressColumn(),
            console=err,
            disable=output is Output.json,
        )
        with bar:
            task = bar.add_task("upload", total=None)
            uploaded = stare.files.upload(
                path,
                purpose=purpose,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )
    if output is Output.json:
        emit_json(uploaded)
    else:
        out.print(f"uploaded {uploaded.id} ({uploaded.records} records, {uploaded.bytes} bytes)")


@files_app.command("list")
def files_list(output: OutputOpt = Output.table) -> None:
    """This tenant's files, newest first."""
    with client() as stare:
        found = list(stare.files.list())
    if output is Output.json:
        emit_json(found)
        return
    table = Table()
    for column in ("id", "filename", "purpose", "records", "bytes", "created"):
        table.add_column(column)
    for f in found:
        table.add_row(
            f.id, f.filename, f.purpose, str(f.records), str(f.bytes), f"{f.created_at:%Y-%m-%d %H:%M:%S}"
        )
    out.print(table)


@files_app.command("delete")
def files_delete(
    file_id: Annotated[str, typer.Argument(help="A file id (file_...).")], output: OutputOpt = Output.table
) -> None:
    """Delete a file (refused while an unfinished job uses it)."""
    with client() as stare:
        deleted = stare.files.delete(file_id)
    emit_json(deleted) if output is Output.json else out.print(f"deleted {deleted.id}")


# ------------------------------------------------------------------------------------------------- keys


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Option(help="A name to recognise the key by.")] = "default",
    output: OutputOpt = Output.table,
) -> None:
    """A new API key; the secret is printed once."""
    with client() as stare:
        key = stare.keys.create(name)
    if output is Output.json:
        emit_json(key)
    else:
        out.print(f"{key.id} ({key.name}); the secret, shown only now:")
        sys.stdout.write(key.key + "\n")


@keys_app.command("list")
def keys_list(output: OutputOpt = Output.table) -> None:
    """This tenant's keys (prefixes only), revoked ones included."""
    with client() as stare:
        found = stare.keys.list()
    if output is Output.json:
        emit_json(found)
        return
    table = Table()
    for column in ("id", "name", "prefix", "created", "last used", "revoked"):
        table.add_column(column)
    for k in found:
        table.add_row(
            k.id, k.name, k.prefix, f"{k.created_at:%Y-%m-%d %H:%M}", _fmt(k.last_used_at), _fmt(k.revoked_at)
        )
    out.print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="A key id (key_...).")], output: OutputOpt = Output.table
) -> None:
    """Revoke a key at once (not the tenant's last active one)."""
    with client() as stare:
        key = stare.keys.revoke(key_id)
    emit_json(key) if output is Output.json else out.print(f"revoked {key.id} ({key.name})")


# ------------------------------------------------------------------------------------------------ local
# The embedded stack is the server's (`python -m worker embedded`); these commands only start it, so the
# client package imports nothing of the server.

HomeOpt = Annotated[
    Path | None,
    typer.Option(
        "--home", help="The stack's folder (database, artifacts, logs, key); default $STARE_HOME or .stare."
    ),
]


def _embedded(*args: str) -> list[str]:
    return [sys.executable, "-m", "worker", "embedded", *args]


def _read_state(home: Path) -> dict[str, Any] | None:
    try:
        value = json.loads((home / "embedded.json").read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@local_app.command("up")
def local_up(
    home_opt: HomeOpt = None,
    port: Annotated[int | None, typer.Option(help="The API's port (default: a free one).")] = None,
    wait_s: Annotated[
        float, typer.Option("--wait", help="Seconds to wait for the stack to come up.")
    ] = 120.0,
    output: OutputOpt = Output.table,
) -> None:
    """Start the embedded stack (API on SQLite, a local worker) in the background and leave it running;
    `stare` commands then find it through <home>/embedded.json and <home>/api-key."""
    home = local_home(home_opt)
    state = _read_state(home)
    if state is not None and isinstance(state.get("pid"), int) and _alive(state["pid"]):
        fail(f"a local stack is already running under {home} (pid {state['pid']}); stare local down stops it")
    home.mkdir(parents=True, exist_ok=True)
    (home / "embedded.json").unlink(missing_ok=True)
    args = ["--serve", "--home", str(home)] + (["--port", str(port)] if port else [])
    log_path = home / "local-up.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            _embedded(*args),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + wait_s
    while (state := _read_state(home)) is None:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            fail(f"the local stack exited with {proc.returncode}: {tail[0]} (log: {log_path})")
        if time.monotonic() > deadline:
            proc.terminate()
            fail(f"the local stack did not come up in {wait_s:g} s (log: {log_path})")
        time.sleep(0.3)
    info = {
        "api": state.get("api") or state.get("url"),
        "page": state.get("url"),
        "pid": state.get("pid"),
        "home": str(home),
        "api_key_file": str(home / "api-key"),
    }
    if output is Output.json:
        emit_json(info)
    else:
        out.print(f"local stack up (pid {info['pid']}): API {info['api']}, job page {info['page']}")
        out.print(f"API key in {info['api_key_file']}; `stare local down --home {home}` stops it")


@local_app.command("down")
def local_down(home_opt: HomeOpt = None, output: OutputOpt = Output.table) -> None:
    """Stop the stack `stare local up` started (SIGTERM, then wait for it to go)."""
    home = local_home(home_opt)
    state = _read_state(home)
    pid = state.get("pid") if state else None
    if not isinstance(pid, int) or not _alive(pid):
        fail(f"no local stack is running under {home}")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        fail(f"the local stack (pid {pid}) did not stop in 60 s")
    emit_json({"stopped": pid}) if output is Output.json else out.print(f"local stack (pid {pid}) stopped")


@local_app.command("demo")
def local_demo(
    home_opt: HomeOpt = None,
    spec: Annotated[Path, typer.Option(help="The job spec to run.")] = Path("trainer/specs/demo.yaml"),
    output: OutputOpt = Output.table,
) -> None:
    """Run the demo: the embedded stack, one job over HTTP, its report under <home>/last-job/."""
    home = local_home(home_opt)
    if not spec.is_file():
        fail(f"spec file {str(spec)!r} not found (run from the repository root, or pass --spec)")
    code = subprocess.call(_embedded("--spec", str(spec), "--home", str(home)))
    if output is Output.json:
        emit_json({"exit_code": code, "report": str(home / "last-job" / "report.json")})
    raise typer.Exit(code)


# ------------------------------------------------------------------------------------------------- main


def exit_code(exc: errors.StareError) -> int:
    if isinstance(exc, errors.ConnectionError):
        return Exit.UNREACHABLE
    if isinstance(exc, errors.AuthError):
        return Exit.AUTH
    return Exit.ERROR


def describe(exc: errors.StareError) -> str:
    if isinstance(exc, errors.APIError):
        text = str(exc)
        problems = [d for d in exc.details if isinstance(d, dict)][:3]
        extra = "; ".join(
            f"{d.get('param') or 'line ' + str(d.get('line'))}: {d.get('message')}"
            for d in problems
            if d.get("message") != exc.message
        )
        return f"{text} [{extra}]" if extra else text
    return str(exc)


def main(argv: list[str] | None = None) -> int:
    """The `stare` entry point: runs the command; errors are one line on stderr with a documented code."""
    debug = os.environ.get("STARE_DEBUG") == "1"
    try:
        code = app(args=argv, prog_name="stare", standalone_mode=False)
    except typer.Exit as done:
        return int(done.exit_code)
    except typer.Abort:
        err.print("aborted")
        return 130
    except typer.TyperException as usage:  # click's usage errors, as typer ships them
        show = getattr(usage, "show", None)
        if callable(show):
            show()
        else:
            err.print(f"error: {usage}")
        return int(getattr(usage, "exit_code", Exit.USAGE))
    except errors.StareError as exc:
        if debug:
            raise
        err.print(f"[bold red]error:[/] {describe(exc)}", soft_wrap=True, markup=True)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug of ours: still one line, unless debugging
        if debug:
            raise
        err.print(
            f"[bold red]error:[/] unexpected {type(exc).__name__}: {exc} (STARE_DEBUG=1 shows where)",
            soft_wrap=True,
        )
        return Exit.ERROR
    return int(code) if isinstance(code, int) else Exit.OK


if __name__ == "__main__":
    sys.exit(main())
