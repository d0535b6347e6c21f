"""`stare local`: the embedded stack on this machine (up, down, demo)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from stare_client.cli.common import Output, OutputOpt, emit_json, fail, local_app, out
from stare_client.config import local_home

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
    `stare` commands then find it through <home>/embedded.json and <home>/api-key. Needs the runtime
    install (`make runtime`) and bubblewrap; the job page's charts need `make web`."""
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
