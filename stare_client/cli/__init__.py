"""`stare`: the command line over the Python client (typer, rich).

    stare jobs submit spec.yaml [--watch] [--idempotency-key K]
    stare jobs validate spec.yaml [--training-file ID|PATH]
    stare jobs list|get|cancel|pause|resume|delete|watch|compare
    stare jobs events JOB [--follow]
    stare checkpoints list JOB | download JOB [latest|best|STEP|ID] [--to DIR] [--merged] [--model-only]
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

The commands live by group in this package (common: what they share; jobs; artifacts: checkpoints and
report; account: files and keys; local); every public name stays importable from `stare_client.cli`.
"""

from __future__ import annotations

import os

import typer

from stare_client import errors
from stare_client.cli.account import (
    files_delete,
    files_list,
    files_upload,
    keys_create,
    keys_list,
    keys_revoke,
)
from stare_client.cli.artifacts import checkpoints_download, checkpoints_list, report

# Importing the command modules registers their commands on `app`.
from stare_client.cli.common import (
    JOB_EXIT,
    STATE,
    Exit,
    JobArg,
    Output,
    OutputOpt,
    State,
    app,
    checkpoints_app,
    client,
    emit_json,
    err,
    fail,
    files_app,
    fmt,
    jobs_app,
    keys_app,
    load_submission,
    local_app,
    out,
    problem_lines,
)
from stare_client.cli.graders import graders_app, graders_run, graders_validate
from stare_client.cli.jobs import (
    BAND_STYLE,
    COMPARE_ROWS,
    STATUS_STYLE,
    compare_summary,
    entropy_text,
    job_table,
    jobs_cancel,
    jobs_compare,
    jobs_delete,
    jobs_get,
    jobs_list,
    jobs_pause,
    jobs_resume,
    jobs_submit,
    jobs_watch,
    show_job,
    status_text,
    watch_job,
)
from stare_client.cli.local import HomeOpt, local_demo, local_down, local_up
from stare_client.cli.notes import jobs_events, show_notes
from stare_client.cli.validate import jobs_validate

__all__ = [
    "BAND_STYLE",
    "COMPARE_ROWS",
    "JOB_EXIT",
    "STATE",
    "STATUS_STYLE",
    "Exit",
    "HomeOpt",
    "JobArg",
    "Output",
    "OutputOpt",
    "State",
    "app",
    "checkpoints_app",
    "checkpoints_download",
    "checkpoints_list",
    "client",
    "compare_summary",
    "describe",
    "emit_json",
    "entropy_text",
    "err",
    "exit_code",
    "fail",
    "files_app",
    "files_delete",
    "files_list",
    "files_upload",
    "fmt",
    "graders_app",
    "graders_run",
    "graders_validate",
    "job_table",
    "jobs_app",
    "jobs_cancel",
    "jobs_compare",
    "jobs_delete",
    "jobs_events",
    "jobs_get",
    "jobs_list",
    "jobs_pause",
    "jobs_resume",
    "jobs_submit",
    "jobs_validate",
    "jobs_watch",
    "keys_app",
    "keys_create",
    "keys_list",
    "keys_revoke",
    "load_submission",
    "local_app",
    "local_demo",
    "local_down",
    "local_up",
    "main",
    "out",
    "problem_lines",
    "report",
    "show_job",
    "show_notes",
    "status_text",
    "watch_job",
]


def exit_code(exc: errors.StareError) -> int:
    if isinstance(exc, errors.ConnectionError):
        return Exit.UNREACHABLE
    if isinstance(exc, errors.AuthError):
        return Exit.AUTH
    return Exit.ERROR


def describe(exc: errors.StareError) -> str:
    if isinstance(exc, errors.APIError):
        text = str(exc)
        if any(isinstance(d, dict) and "field" in d for d in exc.details):
            return text  # a spec's problems: the message says each with its field (`stare jobs validate`)
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
