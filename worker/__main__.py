"""Worker processes.

  python -m worker run [--queues training] [--sweep]   a Celery worker: one training job at a time
  python -m worker sweeper                             the periodic repair pass (stale leases, lost messages)
  python -m worker embedded [--spec S] [--home .stare] one job over HTTP on the embedded stack (SQLite)
  python -m worker embedded --serve [--home H] [--port P]   the embedded stack, running until Ctrl-C
                                                       (home: --home, else $STARE_HOME, else .stare)
  python -m worker exporter [--port 9464]              Prometheus metrics of active jobs, workers, queues

Settings come from STARE_* environment variables (worker/settings.py). On a GPU host, start one worker per
GPU: `CUDA_VISIBLE_DEVICES=0 python -m worker run`, `CUDA_VISIBLE_DEVICES=1 python -m worker run`, ...
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
from typing import Any

from worker.settings import WorkerSettings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m worker")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start a Celery training worker")
    run.add_argument("--queues", default=None, help="comma-separated queues (default: the training queue)")
    run.add_argument("--sweep", action="store_true", help="also run the sweeper in this process")
    run.add_argument("--loglevel", default="INFO")
    sweeper = sub.add_parser("sweeper", help="run the sweeper loop")
    sweeper.add_argument("--once", action="store_true")
    embedded = sub.add_parser(
        "embedded", help="run one job spec over HTTP on the embedded stack (SQLite, no Redis)"
    )
    embedded.add_argument("--spec", default="trainer/specs/demo.yaml")
    embedded.add_argument(
        "--home", default=os.environ.get("STARE_HOME") or ".stare", help="default: $STARE_HOME, else .stare"
    )
    embedded.add_argument("--port", type=int, default=None)
    embedded.add_argument(
        "--serve",
        action="store_true",
        help="start the stack and leave it running (prints the job page's URL and an API key) until Ctrl-C",
    )
    exporter = sub.add_parser("exporter", help="serve Prometheus metrics of active jobs, workers and queues")
    exporter.add_argument("--port", type=int, default=9464)
    exporter.add_argument("--addr", default="127.0.0.1")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "embedded":
        for noisy in ("httpx", "alembic"):  # the launcher's screen: progress lines, not each request
            logging.getLogger(noisy).setLevel(logging.WARNING)
        from worker.embedded import main as embedded_main
        from worker.embedded import serve as embedded_serve

        if args.serve:
            return embedded_serve(args.home, args.port)
        return embedded_main(args.spec, args.home, args.port)
    settings = WorkerSettings()
    refusal = drop_root(settings)
    if refusal is not None:
        logging.getLogger("worker").error("refusing to start: %s", refusal)
        return 2
    from worker.celery_app import create_celery
    from worker.sweeper import sweep_forever, sweep_once

    app = create_celery(settings)
    if args.command == "exporter":
        return _serve_exporter(app.conf.stare_database(), settings, args.addr, args.port)
    if args.command == "sweeper":
        db = app.conf.stare_database()
        if args.once:
            print(sweep_once(db, settings, app.conf.stare_resend, queue_depth=app.conf.stare_queue_depth))
            return 0
        sweep_forever(db, settings, app.conf.stare_resend, threading.Event(), app.conf.stare_queue_depth)
        return 0
    if not _can_confine(settings):  # never run tenants' jobs unconfined unless the operator said so
        return 2
    if args.sweep:
        stop = threading.Event()
        threading.Thread(
            target=sweep_forever,
            args=(
                app.conf.stare_database(),
                settings,
                app.conf.stare_resend,
                stop,
                app.conf.stare_queue_depth,
            ),
            name="sweeper",
            daemon=True,
        ).start()
    queues = args.queues or settings.training_queue
    hostname = f"worker-{os.getpid()}@{socket.gethostname()}"
    from worker.registry import Registration

    registration = Registration(
        app.conf.stare_database(), settings, hostname, [q.strip() for q in queues.split(",") if q.strip()]
    ).start()
    try:
        _consume(app, queues, hostname, args.loglevel)
    finally:
        registration.stop()
    return 0


def drop_root(settings: WorkerSettings) -> str | None:
    """A worker started as root: in production it becomes STARE_WORKER_USER (groups, gid, then uid) before
    anything else, so nothing it does (its database and broker connections, its trainers' confinement)
    runs as root, or it refuses to start (the reason returned, one line). In development it stays root and
    runs its trainers as STARE_TRAINER_UID (worker/isolation.py). None: go on (issue 44, R2)."""
    if os.geteuid() != 0:
        return None
    if settings.worker_user is None:
        if settings.environment == "production":
            return (
                "the worker runs as root in production: run it as its own user (the images run `stare`), or "
                "set STARE_WORKER_USER to the user it should become"
            )
        logging.getLogger("worker").warning(
            "running as root (development): trainers run as uid %d; production refuses this without "
            "STARE_WORKER_USER",
            settings.trainer_uid,
        )
        return None
    try:
        uid, gid, name = _user(settings.worker_user)
    except (KeyError, ValueError):
        return f"STARE_WORKER_USER={settings.worker_user!r} is no user of this host"
    if uid == 0:
        return "STARE_WORKER_USER names root: the worker must become a user that is not root"
    if name is not None:
        os.initgroups(name, gid)
    else:
        os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.geteuid() == 0 or os.getuid() == 0 or (os.getegid() == 0 and gid != 0):
        return "the worker could not leave root"
    logging.getLogger("worker").info("running as uid %d gid %d (STARE_WORKER_USER)", uid, gid)
    return None


def _user(user: str) -> tuple[int, int, str | None]:
    """(uid, gid, name or None) of a user name or a numeric uid (its own number as gid when unnamed)."""
    import pwd

    if user.isdigit():
        try:
            entry = pwd.getpwuid(int(user))
        except KeyError:
            return int(user), int(user), None
        return entry.pw_uid, entry.pw_gid, entry.pw_name
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid, entry.pw_name


def _can_confine(settings: WorkerSettings) -> bool:
    """False (and the reason logged) when trainers must be confined and cannot be (docs/SECURITY.md)."""
    if not settings.trainer_isolation:
        return True
    from worker.isolation import isolation_problem

    problem = isolation_problem()
    if problem is not None:
        logging.getLogger("worker").error(
            "refusing to run jobs: the trainer cannot be confined (%s). Install bubblewrap >= 0.8, "
            "or set STARE_TRAINER_ISOLATION=false where each worker is isolated otherwise "
            "(docs/SECURITY.md)",
            problem,
        )
        return False
    return True


def _consume(app: Any, queues: str, hostname: str, loglevel: str) -> None:
    app.worker_main(
        [
            "worker",
            "--pool=solo",
            "--concurrency=1",
            f"--queues={queues}",
            f"--loglevel={loglevel}",
            f"--hostname={hostname}",
            "--without-gossip",
            "--without-mingle",
        ]
    )


def _serve_exporter(db: object, settings: WorkerSettings, addr: str, port: int) -> int:
    import time

    from prometheus_client import CollectorRegistry, start_http_server

    from worker.metrics import FleetCollector

    registry = CollectorRegistry(auto_describe=False)
    collector = FleetCollector(
        db,  # type: ignore[arg-type]
        settings.broker_url,
        (settings.training_queue,),
        stale_after_s=settings.worker_stale_after_s,
    )
    registry.register(collector)
    start_http_server(port, addr=addr, registry=registry)
    logging.getLogger(__name__).info("exporter on http://%s:%d/metrics", addr, port)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
