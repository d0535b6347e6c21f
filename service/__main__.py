"""Command line of the service (settings from STARE_* environment variables):

python -m service migrate                 # upgrade the database to the latest schema
python -m service create-tenant NAME      # a tenant and its first API key (printed once, on stdout)
python -m service create-key TENANT       # another key for an existing tenant
python -m service serve [--host H] [--port P] [--workers N]   # N > 1 needs STARE_RATE_LIMIT_BACKEND=redis
"""

from __future__ import annotations

import argparse
import sys

from service.errors import ServiceError
from service.settings import Settings
from store import migrate, repository
from store.database import Database
from store.errors import StoreError


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    settings = Settings()
    if args.command == "migrate":
        migrate.upgrade(settings.database_url)
        print(f"database at revision {migrate.head_revision()}", file=sys.stderr)
        return 0
    if args.command == "serve":
        return _serve(args, settings)
    return _create_key(args, settings)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m service", description="stare-rl training service")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="upgrade the database schema to the latest revision")
    tenant = sub.add_parser("create-tenant", help="create a tenant and print its first API key")
    tenant.add_argument("name")
    tenant.add_argument("--key-name", default="default")
    key = sub.add_parser("create-key", help="create another API key for a tenant and print it")
    key.add_argument("tenant")
    key.add_argument("--key-name", default="default")
    serve = sub.add_parser("serve", help="run the HTTP API with uvicorn")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="API processes (each reads its settings from the environment); more than one needs "
        "STARE_RATE_LIMIT_BACKEND=redis unless rate limiting is off",
    )
    return parser


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    """Runs the API with uvicorn: in this process, or in `--workers` processes that each build the app
    from the environment (refused when each would keep its own rate-limit buckets)."""
    import uvicorn

    from service.app import create_app

    if args.workers <= 1:
        uvicorn.run(create_app(settings), host=args.host, port=args.port)
        return 0
    limited = settings.rate_limit_per_second > 0 or settings.tenant_rate_limit_per_second > 0
    if limited and settings.rate_limit_backend != "redis":
        print(
            "several API processes would each keep their own rate-limit buckets: set "
            "STARE_RATE_LIMIT_BACKEND=redis (or STARE_RATE_LIMIT_PER_SECOND=0 and "
            "STARE_TENANT_RATE_LIMIT_PER_SECOND=0)",
            file=sys.stderr,
        )
        return 2
    uvicorn.run("service.app:create_app", factory=True, host=args.host, port=args.port, workers=args.workers)
    return 0


def _create_key(args: argparse.Namespace, settings: Settings) -> int:
    """create-tenant (a new tenant) or create-key (an existing one): an API key, printed once on stdout."""
    db = Database(settings.database_url, pool_size=1)
    try:
        with db.transaction() as session:
            if args.command == "create-tenant":
                row = repository.create_tenant(session, args.name)
            else:
                found = repository.get_tenant_by_name(session, args.tenant)
                if found is None:
                    print(f"no tenant named {args.tenant!r}", file=sys.stderr)
                    return 1
                row = found
            _, secret = repository.create_api_key(session, row.id, args.key_name)
    except (ServiceError, StoreError) as err:
        print(f"error: {err.message}", file=sys.stderr)
        return 1
    finally:
        db.dispose()
    print(f"tenant {row.name} ({row.id}); API key (shown once):", file=sys.stderr)
    print(secret)
    return 0


if __name__ == "__main__":
    sys.exit(main())
