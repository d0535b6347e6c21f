"""Private Redis and PostgreSQL servers: the test session's own (tests/services.py, when no server is
configured for the tests) and those of the suites that restart or flush a server (the worker reliability
suite, the API across a database restart), which must not touch a server other tests use.

A redis-server on a free port (a child process, which dies with the process that started it), and a
PostgreSQL cluster (initdb + pg_ctl) in a folder of its own on a free port, TCP on 127.0.0.1 only, trust
auth, durability off. PostgreSQL refuses to run as root, so as root the cluster's commands run as the
`postgres` OS user (`runuser -u postgres --`), which must be able to enter the folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import redis

PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """`redis-server --port P --save "" --appendonly no` as a child process; stop() flushes first."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.log_path = workdir / "redis.log"
        self.pid_path = workdir / "redis.pid"  # for a later session to stop it if this one was killed
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("redis-server") is not None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2, socket_connect_timeout=2)

    def start(self, timeout: float = 20.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "redis is already running"
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # (prctl's parent death is the death of the starting thread: the main thread's is the process's)
            preexec_fn=_die_with_parent if threading.current_thread() is threading.main_thread() else None,
        )
        log.close()
        self.pid_path.write_text(f"{self.proc.pid}\n")
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.client().ping():
                    return
            except redis.RedisError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self, *, flush: bool = True) -> None:
        """FLUSHALL (every queued message is lost), then shut the server down."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if flush:
            with contextlib.suppress(redis.RedisError):
                self.client().flushall()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)
        self.pid_path.unlink(missing_ok=True)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started it ends (a killed test session
    leaves no redis-server behind)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, 15, 0, 0, 0)


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name))
    for candidate in reversed(found):
        if (Path(candidate) / "initdb").exists() and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PrivatePostgres:
    """A throwaway PostgreSQL cluster (trust auth, fsync off) with start/stop/restart, in `base` (a new
    folder under /tmp by default: pytest's tmp_path is 0700 root, and the postgres user cannot enter it)."""

    def __init__(self, base: Path | None = None) -> None:
        bin_dir = _pg_bin()
        if bin_dir is None:
            raise RuntimeError("no initdb/pg_ctl found (looked in /usr/lib/postgresql/*/bin and PATH)")
        self.bin = bin_dir
        self.port = free_port()
        self.as_root = os.geteuid() == 0
        if base is None:
            base = Path(tempfile.mkdtemp(prefix="stare-test-pg-"))
        base.mkdir(parents=True, exist_ok=True)
        self.base = base
        if self.as_root:
            owner = pwd.getpwnam("postgres")
            os.chown(self.base, owner.pw_uid, owner.pw_gid)
        self.data = self.base / "data"
        self.log_path = self.base / "postgres.log"
        self._run(self.bin / "initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8")

    def _run(self, *args: object, timeout: float = 120.0) -> str:
        command = [str(a) for a in args]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done.stdout

    def _options(self) -> str:
        # TCP only (no Unix socket: its path could pass the 107-byte limit in a deep folder).
        return (
            f"-p {self.port} -c unix_socket_directories='' -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )

    def url(self, dbname: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        self._run(
            self.bin / "pg_ctl",
            "-D",
            self.data,
            "-o",
            self._options(),
            "-l",
            self.log_path,
            "-w",
            "-t",
            60,
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(self.bin / "pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", 60, "stop")

    def restart(self) -> None:
        self._run(
            self.bin / "pg_ctl",
            "-D",
            self.data,
            "-m",
            "fast",
            "-o",
            self._options(),
            "-l",
            self.log_path,
            "-w",
            "-t",
            60,
            "restart",
        )

    def running(self) -> bool:
        command = [str(self.bin / "pg_ctl"), "-D", str(self.data), "status"]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, check=False).returncode == 0

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            if self.running():
                self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)
