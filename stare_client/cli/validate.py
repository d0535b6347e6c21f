"""`stare jobs validate`: everything `jobs submit` checks (POST /v1/jobs/estimate), without creating a job.

Valid: the cost the server estimates, exit 0. Invalid: every problem on its own line with the field it is
at (`optim.learning_rate: unknown field; did you mean `lr`?`) or the line of the training file, exit 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from stare_client import errors, models
from stare_client.cli.common import (
    Exit,
    Output,
    OutputOpt,
    client,
    emit_json,
    err,
    jobs_app,
    load_submission,
    out,
    problem_lines,
)
from stare_client.client import Client


def _training_file(stare: Client, given: str | None, quiet: bool) -> str | None:
    """The file id to validate with: an id as given, or a local JSONL file uploaded first (the server
    checks its lines then; it stays uploaded, for `jobs submit --training-file ID`)."""
    if given is None or not Path(given).is_file():
        return given
    uploaded = stare.files.upload(given)
    if not quiet:
        err.print(
            f"uploaded {escape(given)} as {uploaded.id} (submit with --training-file {uploaded.id})",
            soft_wrap=True,
        )
    return uploaded.id


def _valid_text(estimate: models.Estimate) -> str:
    waiting = "" if estimate.allowed_to_proceed else " (the tenant's active-job limit holds it back now)"
    return (
        f"valid: {estimate.total_steps} steps × {estimate.responses_per_step} responses "
        f"({estimate.total_responses} in all, at most {estimate.max_completion_tokens} tokens each), "
        f"{estimate.evaluations} evaluations, {estimate.checkpoints} checkpoints; queue {estimate.queue} "
        f"on {estimate.worker_class}, {estimate.jobs_ahead} jobs ahead{waiting}"
    )


def _invalid(exc: errors.APIError, output: Output) -> None:
    if output is Output.json:
        body: dict[str, Any] = {"valid": False, "code": exc.code, "message": exc.message, "param": exc.param}
        emit_json(body | {"problems": exc.details})
        return
    lines = problem_lines(exc.details) or [f"{exc.param or 'request'}: {exc.message}"]
    out.print(f"invalid: {len(lines)} problem{'s' if len(lines) != 1 else ''}", soft_wrap=True)
    for line in lines:
        out.print(f"  {escape(line)}", soft_wrap=True)


@jobs_app.command("validate")
def jobs_validate(
    spec_file: Annotated[Path, typer.Argument(help="A YAML job spec, as for `jobs submit`.")],
    training_file: Annotated[
        str | None,
        typer.Option(
            "--training-file",
            help="An uploaded file id, or a local JSONL file (uploaded first, so its lines are checked too).",
        ),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Check a spec as `jobs submit` would, creating no job: every problem with its field path (exit 1), or
    the estimated cost (exit 0)."""
    body = load_submission(spec_file)
    with client() as stare:
        try:
            file_id = _training_file(stare, training_file or body.get("training_file"), output is Output.json)
            estimate = stare.jobs.estimate(body["spec"], training_file=file_id, metadata=body.get("metadata"))
        except errors.ValidationError as exc:
            _invalid(exc, output)
            raise typer.Exit(Exit.ERROR) from None
    emit_json(estimate) if output is Output.json else out.print(_valid_text(estimate), soft_wrap=True)
