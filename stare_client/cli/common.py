"""What every command group of `stare` shares: the exit codes, the typer apps, the consoles, the
connection options, the client, errors and JSON output, and reading a job spec."""

from __future__ import annotations

import json
import sys
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import yaml
from pydantic import BaseModel
from rich.console import Console

from stare_client.client import Client


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
    help="The embedded stack on this machine. Needs the runtime install (`make runtime`: torch and the "
    "trainer, service and client extras), not the full one, and bubblewrap to confine its trainers.",
    no_args_is_help=True,
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


def problem_lines(details: list[Any]) -> list[str]:
    """One line per entry of an API error's `details`: where (a spec field, or a file's line and key), then
    what is wrong and how to fix it."""
    lines = []
    for detail in details:
        if not isinstance(detail, dict):
            continue
        if detail.get("line") is not None:
            where = f"line {detail['line']}" if detail["line"] else "file"
            where += f" ({detail['param']})" if detail.get("param") else ""
        else:
            where = str(detail.get("field") or detail.get("param") or "request")
        lines.append(f"{where}: {detail.get('message')}")
    return lines


def fmt(value: Any, digits: int = 3) -> str:
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
