"""Rate limiting: a token bucket per API key; over the limit is a 429 with Retry-After, per key."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

from service.ratelimit import TokenBucketLimiter
from tests.service.conftest import TenantKey
from tests.service.test_errors import assert_error


def test_over_the_limit_is_a_429_with_retry_after_for_that_key_only(
    make_client: Callable[..., TestClient], make_tenant: Callable[[], TenantKey]
) -> None:
    client = make_client(rate_limit_per_second=0.2, rate_limit_burst=3)
    first, second = make_tenant(), make_tenant()
    statuses = [client.get("/v1/jobs", headers=first.headers).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
    response = client.get("/v1/jobs", headers=first.headers)
    assert_error(response, 429, "rate_limit_exceeded")
    assert 1 <= int(response.headers["Retry-After"]) <= 5
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
