"""The embedded stack: the whole product on one machine with nothing else running.

SQLite (WAL) instead of PostgreSQL, Celery's filesystem transport instead of Redis, one local worker with
its sweeper, and the API under uvicorn, all under one home folder. `run_job_over_http` submits a job spec
over HTTP exactly as a user would, follows its progress, and fetches the evaluation report.

    python -m worker embedded --spec trainer/specs/demo.yaml [--home .stare] [--port 8765]
    python -m worker embedded --serve [--home .stare] [--port 8765]

`--serve` starts the stack and leaves it running until Ctrl-C or SIGTERM: it prints the job page's URL and
an API key to sign in with, and writes them for other tools (the `stare` CLI) to read: `<home>/embedded.json`
({"url", "api", "pid"}; removed at a clean shutdown) and `<home>/api-key` (mode 0600).

Both modes check first that the worker will run jobs here (bubblewrap present and working, unless
STARE_TRAINER_ISOLATION=false) and start nothing when it will not: one line naming the package and the
command, exit 2. Then they watch both processes they started (worker/children.py): when the API or the
worker exits on its own, the launcher stops the other within seconds, prints the process's reason and last
log lines (<home>/logs/api.log, worker.log), and exits 1; it never follows a job that nothing can run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from store import migrate, repository
from store.database import Database
from worker.children import Child, ChildExited, confinement_problem, raise_if_exited, stop

TERMINAL = ("succeeded", "failed", "cancelled")
# How long the children get to stop after SIGTERM: at the end of a clean run or a Ctrl-C (a running
# trainer checkpoints), and when something went wrong (a child exited, the job could not be followed).
CLEAN_STOP_S = 30.0
STOP_GRACE_S = 3.0


def embedded_env(home: Path) -> dict[str, str]:
    home = home.resolve()
    return {
        "STARE_ENVIRONMENT": "development",
        "STARE_DATABASE_URL": f"sqlite:///{home / 'stare.db'}",
        "STARE_ARTIFACT_ROOT": str(home / "artifacts"),
        "STARE_BROKER_URL": "filesystem://",
        "STARE_BROKER_FOLDER": str(home / "broker"),
        "STARE_HEARTBEAT_S": "5",
        "STARE_STALE_AFTER_S": "30",
        "STARE_SWEEP_INTERVAL_S": "5",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tenant_key(database_url: str) -> str:
    db = Database(database_url, pool_size=1)
    try:
        with db.transaction() as session:
            tenant = repository.get_tenant_by_name(session, "embedded") or repository.create_tenant(
                session, "embedded"
            )
            _, secret = repository.create_api_key(session, tenant.id, f"embedded-{int(time.time())}")
        return secret
    finally:
        db.dispose()


@contextlib.contextmanager
def embedded_stack(
    home: Path, port: int | None = None, *, processes: list[Child] | None = None
) -> Iterator[tuple[str, str]]:
    """Starts API + worker under `home`; yields (base URL, API key) once the API answers; stops both on exit
    (the survivor within STOP_GRACE_S when the body raised ChildExited: one of them exited). `processes`,
    when given, receives the two children (worker.children.Child: to watch them). Raises ChildExited when
    either exits before the API answers."""
    env_vars = embedded_env(home)
    for key in ("STARE_ARTIFACT_ROOT", "STARE_BROKER_FOLDER"):
        Path(env_vars[key]).mkdir(parents=True, exist_ok=True)
    migrate.upgrade(env_vars["STARE_DATABASE_URL"])
    api_key = _tenant_key(env_vars["STARE_DATABASE_URL"])
    port = port or _free_port()
    env = {
        **os.environ,
        **env_vars,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH", "")])),
    }
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    commands = {
        "API": [sys.executable, "-m", "service", "serve", "--host", "127.0.0.1", "--port", str(port)],
        "worker": [sys.executable, "-m", "worker", "run", "--sweep"],
    }
    children: list[Child] = []
    for name, command in commands.items():
        log = logs / f"{name.lower()}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        children.append(Child(name, proc, log))
    if processes is not None:
        processes.extend(children)
    yield from _serve(children, port, api_key)


def _serve(children: list[Child], port: int, api_key: str) -> Iterator[tuple[str, str]]:
    base = f"http://127.0.0.1:{port}"
    grace_s = CLEAN_STOP_S
    try:
        deadline = time.time() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            raise_if_exited(children)
            if time.time() > deadline:
                raise RuntimeError(f"the API did not answer in 60 s; see {children[0].log}")
            time.sleep(0.3)
        yield base, api_key
    except ChildExited:
        grace_s = STOP_GRACE_S  # the survivor at once (a Ctrl-C leaves a running trainer time to checkpoint)
        raise
    finally:
        stop(children, grace_s)


def run_job_over_http(
    base: str,
    api_key: str,
    spec: dict[str, Any],
    out: Path,
    *,
    timeout_s: float = 3600,
    watch: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """POST the spec, follow it to the end, save report.html/json under `out`; returns the final job object.
    `watch` is called before every poll (the launcher's: it raises when the API or the worker has exited, so
    a job that nothing can run is never polled for long)."""
    headers = {"Authorization": f"Bearer {api_key}"}
    check = watch or (lambda: None)
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
        created = client.post(
            "/v1/jobs", json={"spec": spec}, headers={"Idempotency-Key": f"embedded-{time.time_ns()}"}
        )
        if created.status_code != 201:
            raise RuntimeError(f"job rejected ({created.status_code}): {created.text}")
        job = created.json()
        print(f"submitted {job['id']} ({job['algorithm']} on {job['model']}); following it", flush=True)
        print(f"live page: {page_url(base, job['id'])}", flush=True)
        job = _follow(client, job, timeout_s, check)
        _save_report(client, job["id"], out)
        checkpoints = client.get(f"/v1/jobs/{job['id']}/checkpoints").json().get("data", [])
        job["checkpoints"] = [c["id"] for c in checkpoints]
        return dict(job)


def _follow(
    client: httpx.Client, job: dict[str, Any], timeout_s: float, check: Callable[[], None]
) -> dict[str, Any]:
    """Poll the job once a second until it ends, printing its progress line when it changes."""
    deadline = time.time() + timeout_s
    last_line = ""
    while job["status"] not in TERMINAL:
        if time.time() > deadline:
            raise TimeoutError(f"job {job['id']} did not finish in {timeout_s:.0f} s")
        time.sleep(1.0)
        check()
        try:
            job = client.get(f"/v1/jobs/{job['id']}").raise_for_status().json()
        except httpx.HTTPError:
            check()  # the API is gone: say so rather than show the connection error
            raise
        line = progress_line(job)
        if line != last_line:
            print(line, flush=True)
            last_line = line
    return job


def _save_report(client: httpx.Client, job_id: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report = client.get(f"/v1/jobs/{job_id}/report")
    if report.status_code == 200:
        (out / "report.json").write_text(json.dumps(report.json(), indent=2))
        html = client.get(f"/v1/jobs/{job_id}/report", params={"format": "html"})
        if html.status_code == 200:
            (out / "report.html").write_text(html.text)


def progress_line(job: dict[str, Any]) -> str:
    """`[running]  step 3/500  entropy 0.412 (in_band)  accuracy 0.62`; a job that no live worker can take
    shows why it waits (the job view's `waiting`) instead of a bare `[queued]`."""
    progress = job.get("progress") or {}
    entropy = job.get("entropy") or {}
    metrics = (job.get("latest_metrics") or {}).get("values") or {}
    parts = [f"[{job['status']}]"]
    waiting = job.get("waiting") or {}
    if waiting.get("message"):
        parts.append(f"waiting: {waiting['message']}")
    parts.append(f"step {progress.get('step', 0)}/{progress.get('total_steps', '?')}")
    if entropy.get("value") is not None:
        parts.append(f"entropy {entropy['value']:.3f} ({entropy.get('state')})")
    if metrics.get("reward/accuracy") is not None:
        parts.append(f"accuracy {metrics['reward/accuracy']:.2f}")
    return "  ".join(parts)


def page_url(base: str, job_id: str | None = None) -> str:
    """The job page (service/routers/pages.py): the jobs list, or one job's live page."""
    return f"{base}/ui/jobs/{job_id}" if job_id else f"{base}/ui/jobs"


def write_key_file(home: Path, api_key: str) -> Path:
    """`<home>/api-key`, readable by the owner only (0600 from its creation, not chmod-ed afterwards)."""
    path = home / "api-key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(api_key + "\n")
    return path


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(tmp, path)


def serve(home: str, port: int | None) -> int:
    """Start the stack, print the page's URL and a key, and run until SIGINT/SIGTERM; 0 after a clean stop,
    2 when the worker could not run jobs here (nothing started), 1 when the API or the worker exited on its
    own (its last log lines and reason printed)."""
    problem = confinement_problem()
    if problem is not None:
        print(f"not started: {problem}", file=sys.stderr)
        return 2
    home_dir = Path(home)
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    children: list[Child] = []
    state = home_dir / "embedded.json"
    try:
        with embedded_stack(home_dir, port, processes=children) as (base, api_key):
            key_file = write_key_file(home_dir, api_key)
            _write_json(state, {"url": page_url(base), "api": base, "pid": os.getpid()})
            print(f"embedded stack up under {home_dir}/ (SQLite, filesystem broker, one local worker)")
            print(f"job page: {page_url(base)}")
            print(f"API:      {base}  (OpenAPI docs at {base}/docs)")
            print(f"sign in with this API key (also in {key_file}):")
            print(api_key)
            print("Ctrl-C or SIGTERM stops the stack.", flush=True)
            try:
                while not stopping.wait(0.5):
                    raise_if_exited(children)
            finally:
                state.unlink(missing_ok=True)
    except ChildExited as exited:
        print(exited.report(), file=sys.stderr)
        return 1
    print("embedded stack stopped", flush=True)
    return 0


def main(spec_path: str, home: str, port: int | None) -> int:
    """`make demo`: one job over HTTP on the embedded stack. 0 when it succeeded; 2 when the worker could not
    run jobs here (said before anything starts); 1 when the job did not succeed, did not finish within the
    hour, or the API or the worker exited on its own (then within seconds, with that process's reason and
    last log lines)."""
    problem = confinement_problem()
    if problem is not None:
        print(f"not started: {problem}", file=sys.stderr)
        return 2
    spec = yaml.safe_load(Path(spec_path).read_text())
    home_dir = Path(home)
    children: list[Child] = []
    try:
        with embedded_stack(home_dir, port, processes=children) as (base, api_key):
            key_file = write_key_file(home_dir, api_key)
            where = f"API {base} (SQLite, filesystem broker, one local worker) under {home_dir}/"
            print(f"embedded stack up: {where}")
            sign_in = f"sign in with the API key in {key_file}; open while the job runs"
            print(f"job page: {page_url(base)} ({sign_in})")
            job = run_job_over_http(
                base, api_key, spec, home_dir / "last-job", watch=lambda: raise_if_exited(children)
            )
    except ChildExited as exited:
        print(exited.report(), file=sys.stderr)
        return 1
    except TimeoutError as err:  # a machine far slower than the demo's few minutes: said, not a traceback
        print(f"stopped: {err}; the stack was stopped (its logs: {home_dir / 'logs'})", file=sys.stderr)
        return 1
    _print_outcome(job, home_dir)
    return 0 if job["status"] == "succeeded" else 1


def _print_outcome(job: dict[str, Any], home_dir: Path) -> None:
    evaluation = {}
    report_path = home_dir / "last-job" / "report.json"
    if report_path.exists():
        evaluation = json.loads(report_path.read_text()).get("evaluation", {})
    print(f"job {job['id']}: {job['status']}")
    if evaluation.get("before") and evaluation.get("after"):
        before, after = evaluation["before"], evaluation["after"]
        print(
            f"held-out avg@k: {before.get('avg_at_k')} before RL (step 0) → {after.get('avg_at_k')} after step {after.get('step')}"
        )
    print(f"report: {home_dir / 'last-job' / 'report.html'}; checkpoints: {len(job.get('checkpoints', []))}")
