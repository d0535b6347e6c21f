"""API keys: prefixed, stored only as SHA-256, compared in constant time, refused once revoked; and the job
page's session cookie, which authenticates through the same function (cache, last-used record, rate bucket)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service.sessions import COOKIE_NAME, SessionSigner
from store import keys, repository
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


# ------------------------------------------------- the job page's session cookie: the same authentication


def _session_cookie(client: TestClient, key: str) -> str:
    client.cookies.clear()
    signed_in = client.post("/ui/session", json={"api_key": key}, headers={"X-Stare-Sign-In": "1"})
    assert signed_in.status_code == 200, signed_in.text
    cookie = client.cookies.get(COOKIE_NAME)
    assert cookie is not None
    return cookie


def test_a_key_revoked_elsewhere_ends_its_sessions_within_the_cache_ttl(
    make_client: Callable[..., TestClient], make_tenant: Callable[[], TenantKey], db: Database
) -> None:
    """A cookie resolves to its key through the key's own cache entry: revoked behind the API's back (another
    process, the command line), key and sessions stop together, within auth_cache_ttl_s."""
    client = make_client(auth_cache_ttl_s=30.0)
    cache = client.app.state.services.principals  # type: ignore[attr-defined]
    now = [1000.0]
    cache.clock = lambda: now[0]
    tenant = make_tenant()
    with db.transaction() as s:
        repository.create_api_key(s, tenant.tenant_id, "spare")
    _session_cookie(client, tenant.key)
    assert client.get("/v1/me").status_code == 200
    with db.transaction() as s:
        key = repository.get_api_key(s, tenant.tenant_id, tenant.key_id)
        assert key is not None
        repository.revoke_api_key(s, key)
    assert client.get("/v1/me").status_code == 200  # cached, as the key itself is
    assert client.get("/v1/me", headers=tenant.headers).status_code == 200
    now[0] += 31.0
    assert_error(client.get("/v1/me"), 401, "api_key_revoked")
    assert client.get("/ui/jobs", follow_redirects=False).status_code == 303
    assert_error(client.get("/v1/me", headers=tenant.headers), 401, "api_key_revoked")

    uncached = make_client(auth_cache_ttl_s=0.0)
    other = make_tenant()
    with db.transaction() as s:
        repository.create_api_key(s, other.tenant_id, "spare")
    _session_cookie(uncached, other.key)
    assert uncached.get("/v1/me").status_code == 200
    with db.transaction() as s:
        key = repository.get_api_key(s, other.tenant_id, other.key_id)
        assert key is not None
        repository.revoke_api_key(s, key)
    assert_error(uncached.get("/v1/me"), 401, "api_key_revoked")  # no cache: at once


def test_a_session_records_the_keys_use_and_spends_its_rate_bucket(
    make_client: Callable[..., TestClient], make_tenant: Callable[[], TenantKey], db: Database
) -> None:
    client = make_client(auth_cache_ttl_s=0.0, rate_limit_per_second=0.01, rate_limit_burst=4)
    tenant = make_tenant()
    _session_cookie(client, tenant.key)  # one token: the sign-in checks the key as a request does
    with db.transaction() as s:
        s.execute(sa.update(ApiKey).where(ApiKey.id == tenant.key_id).values(last_used_at=None))
    assert client.get("/v1/me").status_code == 200  # two
    with db.sessions() as s:
        row = s.get(ApiKey, tenant.key_id)
        assert row is not None and row.last_used_at is not None  # recorded for the cookie as for Bearer
    assert client.get("/v1/jobs", headers=tenant.headers).status_code == 200  # three: the same bucket
    assert client.get("/v1/jobs").status_code == 200  # four
    limited = client.get("/v1/jobs")
    assert_error(limited, 429, "rate_limit_exceeded")
    assert int(limited.headers["Retry-After"]) >= 1
    assert_error(client.get("/v1/jobs", headers=tenant.headers), 429, "rate_limit_exceeded")
    assert client.get("/ui/jobs").status_code == 429  # the pages too


def test_cookie_and_key_answer_alike_when_missing_or_bad(client: TestClient, tenant: TenantKey) -> None:
    client.cookies.clear()
    assert_error(client.get("/v1/jobs"), 401, "missing_api_key")
    client.cookies.set(COOKIE_NAME, "forged.value", path="/")
    response = client.get("/v1/jobs")
    assert_error(response, 401, "invalid_session")
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert client.get("/v1/jobs", headers=tenant.headers).status_code == 200  # Bearer wins over a cookie
    basic = client.get("/v1/jobs", headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert_error(basic, 401, "missing_api_key")  # a header that is there is never silently skipped
    client.cookies.clear()


def test_a_signed_cookie_with_impossible_fields_is_refused() -> None:
    """Only the server signs cookies, but verify() still checks every field's shape: a leaked secret must
    not carry a NUL or an overlong id into the database lookup."""
    signer = SessionSigner(b"s" * 32, ttl_s=60)
    good, session = signer.issue("key_01ABC", "ten_01ABC", now=1000.0)
    assert signer.verify(good, now=1001.0) == session
    for key_id, tenant_id in [("key_\x00", "ten_1"), ("key_1", "ten_" + "x" * 200), ("1", "ten_1"), ("", "")]:
        cookie, _ = signer.issue(key_id, tenant_id, now=1000.0)
        assert signer.verify(cookie, now=1001.0) is None, (key_id, tenant_id)
    far, _ = signer.issue("key_1", "ten_1", now=2.0**41)
    assert signer.verify(far, now=2.0**41) is None
