"""`stare files` (JSONL datasets) and `stare keys` (API keys): what a tenant owns besides its jobs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
from rich.table import Table

from stare_client.cli.common import (
    Output,
    OutputOpt,
    client,
    emit_json,
    err,
    fail,
    files_app,
    fmt,
    keys_app,
    out,
)

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
            k.id, k.name, k.prefix, f"{k.created_at:%Y-%m-%d %H:%M}", fmt(k.last_used_at), fmt(k.revoked_at)
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
