"""Rate limiting: a token bucket per API key and one per tenant (its keys together); over either limit is a 429
with Retry-After. In process, or in Redis (shared by several API processes, falling back to in process when
Redis is down). A tenant has at most max_active_keys_per_tenant active keys (409 past it)."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.ratelimit import RedisTokenBucketLimiter, TokenBucketLimiter
from tests.service.conftest import TenantKey
from tests.service.test_errors import assert_error
from tests.services import redis_url


def assert_retry_after(response: Any, *, refill_s: float, elapsed_s: float) -> None:
    """Retry-After is the whole seconds until the next token: the refill time less what has passed since the
    burst began, rounded up (5 when the burst was spent within a second)."""
    retry_after = int(response.headers["Retry-After"])
    assert math.ceil(refill_s - elapsed_s) <= retry_after <= math.ceil(refill_s)


def test_over_the_limit_is_a_429_with_retry_after_for_that_key_only(
    make_client: Callable[..., TestClient], make_tenant: Callable[[], TenantKey]
) -> None:
    client = make_client(rate_limit_per_second=0.2, rate_limit_burst=3)
    first, second = make_tenant(), make_tenant()
    start = time.monotonic()
    statuses = [client.get("/v1/jobs", headers=first.headers).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
    response = client.get("/v1/jobs", headers=first.headers)
    assert_error(response, 429, "rate_limit_exceeded")
    assert_retry_after(response, refill_s=1 / 0.2, elapsed_s=time.monotonic() - start)
    assert client.get("/v1/jobs", headers=second.headers).status_code == 200
    assert client.get("/healthz").status_code == 200  # unauthenticated health checks are not limited


def test_the_bucket_refills_at_the_rate() -> None:
    now = [0.0]
    limiter = TokenBucketLimiter(rate=2.0, burst=2, clock=lambda: now[0])
    assert [limiter.acquire("k") for _ in range(2)] == [0.0, 0.0]
    assert limiter.acquire("k") == 0.5  # one token arrives in 1/rate seconds
    now[0] += 0.5
    assert limiter.acquire("k") == 0.0
    now[0] += 10.0
    assert [limiter.acquire("k") for _ in range(3)] == [0.0, 0.0, 0.5]  # refills up to the burst, no more


def redis_settings(**overrides: Any) -> dict[str, Any]:
    """An app whose buckets live in Redis, under a prefix of its own (tests share the Redis server)."""
    return {"rate_limit_backend": "redis", "rate_limit_redis_url": redis_url(), **overrides}


def test_with_redis_several_api_processes_share_one_bucket_per_key(
    make_client: Callable[..., TestClient], make_tenant: Callable[[], TenantKey]
) -> None:
    first, second = make_tenant(), make_tenant()
    # Two apps stand for two API processes; each tenant's key has its own bucket in Redis.
    apps = [make_client(**redis_settings(rate_limit_per_second=0.2, rate_limit_burst=3)) for _ in range(2)]
    start = time.monotonic()
    assert isinstance(apps[0].app.state.services.limiter, RedisTokenBucketLimiter)  # type: ignore[attr-defined]
    statuses = [apps[i % 2].get("/v1/jobs", headers=first.headers).status_code for i in range(3)]
    assert statuses == [200, 200, 200]
    for app in apps:  # the burst is spent, whichever process answers
        response = app.get("/v1/jobs", headers=first.headers)
        assert_error(response, 429, "rate_limit_exceeded")
        assert_retry_after(response, refill_s=1 / 0.2, elapsed_s=time.monotonic() - start)
    assert apps[1].get("/v1/jobs", headers=second.headers).status_code == 200


def test_the_redis_bucket_refills_at_the_rate() -> None:
    limiter = RedisTokenBucketLimiter(redis_url(), rate=50.0, burst=2, prefix=f"test:{uuid.uuid4().hex}:")

    async def take() -> list[float]:
        try:
            waits = [await limiter.acquire_async("k") for _ in range(3)]
            await asyncio.sleep(0.05)  # 2.5 tokens' worth of time, capped at the burst
            waits += [await limiter.acquire_async("k") for _ in range(3)]
            return waits
        finally:
            await limiter.aclose()

    waits = asyncio.run(take())
    assert waits[:2] == [0.0, 0.0] and 0 < waits[2] <= 1 / 50
    assert waits[3:5] == [0.0, 0.0] and 0 < waits[5] <= 1 / 50


def test_without_redis_each_process_limits_on_its_own(
    make_client: Callable[..., TestClient], tenant: TenantKey
) -> None:
    client = make_client(
        **redis_settings(
            rate_limit_per_second=0.2, rate_limit_burst=2, rate_limit_redis_url="redis://127.0.0.1:1/0"
        ),
        broker_timeout_s=0.5,
    )
    statuses = [client.get("/v1/jobs", headers=tenant.headers).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]  # Redis is down: the API answers, and still limits


def test_several_processes_without_a_shared_limiter_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.__main__ import main

    monkeypatch.setenv("STARE_RATE_LIMIT_PER_SECOND", "20")
    monkeypatch.setenv("STARE_RATE_LIMIT_BACKEND", "memory")
    assert main(["serve", "--workers", "2"]) == 2


def keys_of(client: TestClient, tenant: TenantKey, count: int) -> list[dict[str, str]]:
    """The tenant's own key and `count` more, minted through the API, as request headers."""
    minted = [
        client.post("/v1/api-keys", json={"name": f"k{i}"}, headers=tenant.headers) for i in range(count)
    ]
    assert [r.status_code for r in minted] == [201] * count, [r.text for r in minted]
    return [tenant.headers] + [{"Authorization": f"Bearer {r.json()['key']}"} for r in minted]


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_minted_keys_share_the_tenants_rate(
    backend: str, make_client: Callable[..., TestClient], make_tenant: Callable[[], TenantKey]
) -> None:
    """A tenant that mints keys does not multiply its rate: 10 keys, each far under its own limit, together
    get the tenant's burst through and then 429 naming the tenant limit; another tenant is not affected."""
    limits = {"rate_limit_per_second": 1000.0, "rate_limit_burst": 1000}
    limits |= {"tenant_rate_limit_per_second": 0.01, "tenant_rate_limit_burst": 25}
    options = redis_settings(**limits) if backend == "redis" else limits
    client = make_client(**options)
    first, second = make_tenant(), make_tenant()
    headers = keys_of(client, first, 9)  # 9 of the tenant's 25 tokens
    statuses = [client.get("/v1/jobs", headers=headers[i % 10]).status_code for i in range(40)]
    assert statuses.count(200) == 25 - 9 and statuses[: 25 - 9] == [200] * (25 - 9), statuses
    error = assert_error(client.get("/v1/jobs", headers=headers[3]), 429, "rate_limit_exceeded")
    assert "per tenant" in error["message"]
    assert client.get("/v1/jobs", headers=second.headers).status_code == 200
    me = client.get("/v1/me", headers=second.headers).json()["limits"]
    assert (me["tenant_rate_limit_per_second"], me["tenant_rate_limit_burst"]) == (0.01, 25)


def test_active_keys_per_tenant_are_capped(make_client: Callable[..., TestClient], tenant: TenantKey) -> None:
    client = make_client(max_active_keys_per_tenant=3)
    assert client.get("/v1/me", headers=tenant.headers).json()["limits"]["max_active_api_keys"] == 3
    keys_of(client, tenant, 2)  # the tenant's own key and two more: 3
    refused = client.post("/v1/api-keys", json={"name": "one too many"}, headers=tenant.headers)
    error = assert_error(refused, 409, "too_many_api_keys")
    assert "max_active_keys_per_tenant = 3" in error["message"]
    listed = client.get("/v1/api-keys", headers=tenant.headers).json()["data"]
    assert len(listed) == 3
    revoked = client.delete(f"/v1/api-keys/{listed[-1]['id']}", headers=tenant.headers)
    assert revoked.status_code == 200
    again = client.post("/v1/api-keys", json={"name": "after a revoke"}, headers=tenant.headers)
    assert again.status_code == 201, again.text
