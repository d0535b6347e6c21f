"""What the bench scripts share. Each script imports it first (`import _common`): `python bench/X.py` puts
bench/ on sys.path, and this module puts the repository root there too, so the scripts import the
project's packages from any working directory, installed or not.

Also here: `machine`, the description of the machine a result was measured on, stored with every result;
and `create_database`, the throwaway database of the benches that need PostgreSQL, on the server their
--postgres-url names (the machine's own by default; tests/bench/test_bench_smoke.py passes the test
session's).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def machine(*packages: str, torch_threads: int | None = None) -> dict[str, Any]:
    """Platform, CPUs, memory, Python, torch (its version, thread count and whether CUDA is there) and the
    versions of `packages`. torch_threads: the count the measurement ran with, when not this process's."""
    import importlib.metadata as md

    import psutil
    import torch

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads() if torch_threads is None else torch_threads,
        "cuda": torch.cuda.is_available(),
        **{pkg: md.version(pkg) for pkg in packages},
    }


SMOKE_HELP = (
    "a smoke run: the smallest sizes and one or two steps, seconds to a minute; it checks that the script "
    "still runs against the code (tests/bench/test_bench_smoke.py runs it in `make test`), not a measurement"
)


def apply_smoke(args: Any, **values: Any) -> None:
    """Under --smoke (args.smoke), set these attributes of the parsed arguments: the script's smoke sizes."""
    if getattr(args, "smoke", False):
        for name, value in values.items():
            setattr(args, name, value)


def emit(result: dict[str, Any], path: str | None, indent: int = 1) -> None:
    """Prints a bench's result as JSON and writes it to `path` (its --json option) when one is given."""
    import json

    text = json.dumps(result, indent=indent)
    print(text)
    if path:
        Path(path).write_text(text + "\n")


DEFAULT_POSTGRES_URL = "postgresql://127.0.0.1:5432/postgres"
POSTGRES_URL_HELP = (
    "a PostgreSQL database to connect to as an administrator (the bench creates and drops a database of its "
    f"own on that server); default {DEFAULT_POSTGRES_URL}, as the OS user or postgres"
)


def create_database(admin_url: str, prefix: str) -> tuple[str, str, Any]:
    """CREATE DATABASE <prefix>_<pid>_<random> on the server of `admin_url`: (name, its SQLAlchemy URL, the
    open autocommit admin connection, for the DROP at the end)."""
    import uuid
    from urllib.parse import urlsplit

    import psycopg
    from psycopg import sql

    parts = urlsplit(admin_url.replace("postgresql+psycopg://", "postgresql://", 1))
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    admin = None
    for user in (parts.username,) if parts.username else (None, "postgres"):
        try:
            admin = psycopg.connect(
                host=host, port=port, user=user, dbname=parts.path.lstrip("/") or "postgres", autocommit=True
            )
            break
        except psycopg.OperationalError:
            continue
    if admin is None:
        raise RuntimeError(f"cannot reach PostgreSQL at {admin_url} (--postgres-url)")
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name, f"postgresql+psycopg://{admin.info.user}@{host}:{port}/{name}", admin
