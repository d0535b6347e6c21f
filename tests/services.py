"""The PostgreSQL server and the Redis every test that needs one talks to: one place, two settings.

- STARE_TEST_POSTGRES_URL: a PostgreSQL server the tests create (and drop) throwaway databases on, as the
  URL of a database to connect to as an administrator, e.g. `postgresql://postgres@127.0.0.1:5432/postgres`.
- STARE_TEST_REDIS_URL: a Redis the tests may write to, e.g. `redis://127.0.0.1:6379/0`.

Unset (a fresh machine, and `make test`), the test process starts its own on first use: a PostgreSQL
cluster and a redis-server (tests/servers.py) on free ports, their data under
build/test-services/<process>/, stopped and removed when the session ends (pytest_unconfigure in
tests/conftest.py; atexit as well). Under pytest-xdist each worker process has its own pair. A folder left
by a session that was killed (its owner process gone) is stopped and removed by the next session. Their
Debian packages (postgresql, redis-server) are installed by scripts/install-system-deps, as `make test`
does for Prometheus; where they are missing, the tests that need them are skipped as a missing real
component (a failure under STARE_REQUIRE_REAL_COMPONENTS=1).

The machine's own servers are never started, stopped or used unless configured.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import pwd
import shutil
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg import sql

from tests.servers import PrivatePostgres, PrivateRedis

POSTGRES_ENV = "STARE_TEST_POSTGRES_URL"
REDIS_ENV = "STARE_TEST_REDIS_URL"
ROOT = Path(__file__).resolve().parents[1]
SERVICES_DIR = ROOT / "build" / "test-services"
OWNER_FILE = "owner.pid"


class ServiceUnavailable(RuntimeError):
    """The server is not configured and cannot be started here (not installed, cannot run)."""


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    user: str | None  # None: the OS user's name (libpq's default)
    admin_db: str = "postgres"

    def connect(self, dbname: str | None = None, **kwargs: Any) -> psycopg.Connection[Any]:
        """A connection as the configured user; with none configured, as the OS user, else as `postgres`
        (a machine's server with trust auth)."""
        errors = []
        for user in (self.user,) if self.user else (None, "postgres"):
            try:
                return psycopg.connect(
                    host=self.host,
                    port=self.port,
                    user=user,
                    dbname=dbname or self.admin_db,
                    connect_timeout=10,
                    **kwargs,
                )
            except psycopg.OperationalError as err:
                errors.append(f"{user or 'OS user'}: {err}")
        raise psycopg.OperationalError(
            f"cannot reach PostgreSQL on {self.host}:{self.port}: " + "; ".join(errors)
        )

    def admin(self) -> psycopg.Connection[Any]:
        """An autocommit connection to the administration database (CREATE / DROP DATABASE)."""
        return self.connect(autocommit=True)

    def url(self, dbname: str) -> str:
        """The SQLAlchemy URL of a database on this server, as the service's settings take it."""
        with self.admin() as conn:  # the user name libpq resolved, whatever was configured
            user = conn.info.user
        return f"postgresql+psycopg://{user}@{self.host}:{self.port}/{dbname}"

    def create(self, prefix: str = "stare_test") -> str:
        """CREATE DATABASE <prefix>_<pid>_<random>; its name."""
        name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        with self.admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def drop(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


_lock = threading.Lock()
_started: list[PrivatePostgres | PrivateRedis] = []


def postgres() -> PostgresServer:
    """The configured server, else this process's throwaway one (started on the first call)."""
    configured = os.environ.get(POSTGRES_ENV)
    if configured:
        return _parse_postgres(configured)
    return _throwaway_postgres()


def redis_url(db: int = 0) -> str:
    """The configured Redis (its URL as given), else this process's throwaway one, database `db`."""
    configured = os.environ.get(REDIS_ENV)
    if configured:
        return configured
    return _throwaway_redis().url(db)


def _parse_postgres(url: str) -> PostgresServer:
    parts = urlsplit(url.replace("postgresql+psycopg://", "postgresql://", 1))
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
        raise ValueError(f"{POSTGRES_ENV} must look like postgresql://USER@HOST:PORT/DB, got {url!r}")
    return PostgresServer(
        parts.hostname, parts.port or 5432, parts.username, parts.path.lstrip("/") or "postgres"
    )


def _process_folder() -> Path:
    """build/test-services/<xdist worker or main>-<pid>/, the folder this process's servers live in."""
    folder = SERVICES_DIR / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / OWNER_FILE).write_text(f"{os.getpid()}\n")
    return folder


@functools.cache
def _throwaway_postgres() -> PostgresServer:
    with _lock:
        sweep_stale()
        folder = _process_folder() / "postgres"
        if os.geteuid() == 0 and not _enterable_by_postgres(folder.parent):
            folder = None  # a folder the postgres user cannot reach: a private one under /tmp
        try:
            server = PrivatePostgres(folder)
        except (RuntimeError, OSError, KeyError) as err:
            raise ServiceUnavailable(f"PostgreSQL (initdb, pg_ctl): {err}") from None
        try:
            server.start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as err:
            server.destroy()
            raise ServiceUnavailable(f"PostgreSQL did not start: {err}") from None
        _started.append(server)
    return PostgresServer("127.0.0.1", server.port, "postgres")


@functools.cache
def _throwaway_redis() -> PrivateRedis:
    with _lock:
        sweep_stale()
        if not PrivateRedis.available():
            raise ServiceUnavailable("redis-server is not installed")
        server = PrivateRedis(_process_folder())
        try:
            server.start()
        except (RuntimeError, OSError) as err:
            raise ServiceUnavailable(f"redis-server did not start: {err}") from None
        _started.append(server)
    return server


def _enterable_by_postgres(folder: Path) -> bool:
    """Whether the postgres OS user can reach `folder` (every folder above it searchable by others)."""
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return False
    return all(os.stat(parent).st_mode & 0o001 for parent in [folder, *folder.parents])


def stop_all() -> None:
    """Stop and remove this process's throwaway servers (the session's end; idempotent)."""
    with _lock:
        while _started:
            server = _started.pop()
            with contextlib.suppress(Exception):
                server.destroy() if isinstance(server, PrivatePostgres) else server.stop(flush=False)
        folder = SERVICES_DIR / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}"
        shutil.rmtree(folder, ignore_errors=True)
    _throwaway_postgres.cache_clear()
    _throwaway_redis.cache_clear()


def sweep_stale() -> list[Path]:
    """Stop and remove the servers of folders whose owner process is gone (a killed session's)."""
    removed = []
    for folder in sorted(SERVICES_DIR.glob("*")) if SERVICES_DIR.is_dir() else []:
        if _alive(folder / OWNER_FILE):
            continue
        data = folder / "postgres" / "data"
        if (data / "postmaster.pid").is_file():
            _stop_cluster(data)
        redis_pid = folder / "redis.pid"
        if redis_pid.is_file():
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(redis_pid.read_text().split()[0]), signal.SIGTERM)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _alive(owner_file: Path) -> bool:
    """Whether the folder's owner process runs (a folder just made, its owner file not written yet, counts
    as alive for a minute)."""
    try:
        pid = int(owner_file.read_text().split()[0])
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            return time.time() - owner_file.parent.stat().st_mtime < 60
        return False
    except (OSError, ValueError, IndexError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_cluster(data: Path) -> None:
    pg_ctl = shutil.which("pg_ctl") or next(
        iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))), None
    )
    if pg_ctl is None:
        return
    command = [str(pg_ctl), "-D", str(data), "-m", "immediate", "-w", "-t", "30", "stop"]
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, capture_output=True, timeout=60, check=False)


atexit.register(stop_all)
