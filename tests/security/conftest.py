"""The service fixtures (a real PostgreSQL database, the app, tenants with real keys) for the security suites
that go through the API (issue 44)."""

from tests.service.conftest import (  # noqa: F401 - fixtures, registered by import
    artifact_root,
    client,
    db,
    make_client,
    make_tenant,
    pg_url,
    postgres,
    settings,
    tenant,
)
