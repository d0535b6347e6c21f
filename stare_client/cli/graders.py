"""`stare graders`: validate a grader and run it on samples, in the server's sandbox (docs/GRADERS.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from stare_client.cli.common import Output, OutputOpt, app, client, emit_json, fail, fmt, out

graders_app = typer.Typer(
    help="Validate a grader and run it on samples, before training with it.", no_args_is_help=True
)
app.add_typer(graders_app, name="graders")


def _json_file(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        fail(f"{what} {str(path)!r} not found")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {what} {str(path)!r}: {exc}")
    except json.JSONDecodeError as exc:
        fail(f"{what} {str(path)!r} is not JSON: {exc.msg} at line {exc.lineno}")


def _rows(path: Path) -> list[dict[str, Any]]:
    """The JSONL rows: each {"sample": {"output_text": ...}, "item": {...}}."""
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read data file {str(path)!r}: {exc}")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            fail(f"{path}:{number}: not JSON ({exc.msg})")
        if not isinstance(row, dict) or not isinstance(row.get("sample"), dict) or "item" not in row:
            fail(f'{path}:{number}: a row is {{"sample": {{"output_text": ...}}, "item": {{...}}}}')
        rows.append(row)
    if not rows:
        fail(f"data file {str(path)!r} has no rows")
    return rows


def _warnings(warnings: list[Any]) -> None:
    for warning in warnings:
        out.print(f"[yellow]warning:[/] the grader {warning.message}", soft_wrap=True)


@graders_app.command("validate")
def graders_validate(
    grader: Annotated[Path, typer.Argument(help="A grader object (JSON), as a job spec's `grader`.")],
    items: Annotated[Path | None, typer.Option(help="JSONL dataset rows for the loophole check.")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Check a grader's fields, that its source loads in the sandbox, and its loophole warnings."""
    body = _json_file(grader, "grader file")
    rows = [json.loads(line) for line in items.read_text().splitlines() if line.strip()] if items else None
    with client() as stare:
        result = stare.graders.validate(body, items=rows)
    if output is Output.json:
        emit_json(result)
        return
    out.print(f"grader {result.grader.get('name') or result.grader['type']!r} is valid")
    _warnings(result.warnings)


@graders_app.command("run")
def graders_run(
    grader: Annotated[Path, typer.Argument(help="A grader object (JSON), as a job spec's `grader`.")],
    data: Annotated[
        Path, typer.Option("--data", help='JSONL: {"sample": {"output_text": ...}, "item": {...}} per line.')
    ],
    workers: Annotated[int, typer.Option(help="Sandboxed grader processes.")] = 1,
    output: OutputOpt = Output.table,
) -> None:
    """Grade each row of --data as training would: its score or its error, and the loophole warnings."""
    body = _json_file(grader, "grader file")
    rows = _rows(data)
    with client() as stare:
        result = stare.graders.run(body, rows, workers=workers)
    if output is Output.json:
        emit_json(result)
        return
    table = Table("row", "score", "passed", "error", "seconds")
    for number, row in enumerate(result.results, start=1):
        error = f"{row.error.kind}: {row.error.message}" if row.error else ""
        table.add_row(
            str(number), fmt(row.score), "yes" if row.passed else "no", error[:80], fmt(row.seconds)
        )
    out.print(table)
    failed = [row for row in result.results if row.error is not None]
    if failed and failed[0].error is not None and failed[0].error.traceback:
        out.print(f"first error's traceback:\n{failed[0].error.traceback}", soft_wrap=True, markup=False)
    _warnings(result.warnings)
