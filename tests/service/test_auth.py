"""API keys: prefixed, stored only as SHA-256, compared in constant time, refused once revoked."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from store import keys
from store.database import Database
from store.models import ApiKey
from tests.service.conftest import TenantKey
from tests.service.test_errors import assert_error


def test_keys_are_prefixed_and_only_their_sha256_is_stored(
    client: TestClient, tenant: TenantKey, db: Database
) -> None:
    created = client.post("/v1/api-keys", json={"name": "ci"}, headers=tenant.headers)
    assert created.status_code == 201, created.text
    body = created.json()
    secret = body["key"]
    assert secret.startswith("sk-stare-") and len(secret) == keys.KEY_LENGTH
    assert body["prefix"] == secret[: keys.KEY_PREFIX_LENGTH]
    with db.sessions() as session:
        row = session.get(ApiKey, body["id"])
        assert row is not None
        assert row.key_hash == hashlib.sha256(secret.encode()).hexdigest()
        stored = " ".join(
            str(v) for v in session.execute(sa.select(ApiKey.__table__).where(ApiKey.id == row.id)).one()
        )
    assert secret not in stored
    listed = client.get("/v1/api-keys", headers=tenant.headers).json()["data"]
    assert {k["id"] for k in listed} == {tenant.key_id, body["id"]}
    assert all("key" not in k for k in listed)
    assert client.get("/v1/me", headers={"Authorization": f"Bearer {secret}"}).status_code == 200


def test_the_presented_key_is_compared_with_hmac_compare_digest(
    client: TestClient, tenant: TenantKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = keys.hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(keys.hmac, "compare_digest", spy)
    assert client.get("/v1/me", headers=tenant.headers).status_code == 200
    # A key with the right prefix and a wrong secret reaches the comparison and fails it.
    forged = tenant.key[: keys.KEY_PREFIX_LENGTH] + "A" * (keys.KEY_LENGTH - keys.KEY_PREFIX_LENGTH)
    assert_error(client.get("/v1/me", headers={"Authorization": f"Bearer {forged}"}), 401, "invalid_api_key")
    stored = hashlib.sha256(tenant.key.encode()).hexdigest().encode()
    forged_hash = hashlib.sha256(forged.encode()).hexdigest().encode()
    assert (stored, stored) in calls  # the real key, matched
    assert (forged_hash, stored) in calls  # the forged key, compared in constant time and refused
    assert all(len(a) == len(b) == 64 for a, b in calls)


@pytest.mark.parametrize(
    "header",
    [
        None,
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "Bearer sk-stare-short",
        "Bearer " + "x" * 64,
        "Bearer sk-stare-" + "é" * 55,
    ],
)
def test_missing_or_malformed_keys_are_401(client: TestClient, header: str | None) -> None:
    headers = {"Authorization": header.encode("latin-1")} if header is not None else {}
    response = client.get("/v1/jobs", headers=headers)  # type: ignore[arg-type]
    error = assert_error(response, 401)
    assert error["code"] in ("missing_api_key", "invalid_api_key")
    assert response.headers["WWW-Authenticate"] == "Bearer"


def test_a_revoked_key_is_refused(client: TestClient, tenant: TenantKey) -> None:
    second = client.post("/v1/api-keys", json={"name": "second"}, headers=tenant.headers).json()
    revoked = client.delete(
        f"/v1/api-keys/{tenant.key_id}", headers={"Authorization": f"Bearer {second['key']}"}
    )
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert_error(client.get("/v1/me", headers=tenant.headers), 401, "api_key_revoked")
    assert_error(client.get("/v1/jobs", headers=tenant.headers), 401, "api_key_revoked")
    assert client.get("/v1/me", headers={"Authorization": f"Bearer {second['key']}"}).status_code == 200


def test_the_last_active_key_cannot_be_revoked(client: TestClient, tenant: TenantKey) -> None:
    assert_error(
        client.delete(f"/v1/api-keys/{tenant.key_id}", headers=tenant.headers), 409, "last_active_key"
    )
    assert client.get("/v1/me", headers=tenant.headers).status_code == 200


def test_me_reports_tenant_key_limits_and_usage(
    client: TestClient, make_tenant: Callable[[], TenantKey]
) -> None:
    tenant = make_tenant()
    me = client.get("/v1/me", headers=tenant.headers).json()
    assert me["tenant"] == {**me["tenant"], "id": tenant.tenant_id, "name": tenant.name}
    assert me["api_key"]["id"] == tenant.key_id
    assert me["usage"] == {"active_jobs": 0, "jobs": 0, "files": 0, "file_bytes": 0}
    assert me["api_key"]["last_used_at"] is not None
