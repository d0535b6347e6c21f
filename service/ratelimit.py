"""Per-API-key token buckets: in process (`memory`, the default), or in Redis (`redis`) for several API
processes.

In process: with one API process per host (uvicorn, one worker) one bucket per key is exact, costs no
network round trip, and keeps the API answering when Redis is down. With N API processes each would keep
its own buckets (a key would get up to N times the rate), so `python -m service serve --workers N` needs
STARE_RATE_LIMIT_BACKEND=redis: the same arithmetic in a Lua script on Redis (its clock, one round trip per
request, from the event loop). If Redis cannot be reached the request is limited by this process's own
bucket instead (logged), so a Redis outage neither blocks the API nor lifts the limit entirely.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

logger = logging.getLogger(__name__)


class RateLimiter(Protocol):
    rate: float

    @property
    def enabled(self) -> bool: ...

    async def acquire_async(self, key: str) -> float: ...

    async def aclose(self) -> None: ...


@dataclass
class _Bucket:
    tokens: float
    updated: float


class TokenBucketLimiter:
    """`rate` tokens per second refill, up to `burst`; each request takes one. rate 0 disables limiting."""

    def __init__(
        self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def acquire(self, key: str) -> float:
        """Take a token: 0.0 when allowed, else the seconds until one is available."""
        if not self.enabled:
            return 0.0
        now = self.clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= self.max_keys:
                    self._evict_full(now)
                bucket = self._buckets[key] = _Bucket(float(self.burst), now)
            bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return 0.0
            return (1.0 - bucket.tokens) / self.rate

    async def acquire_async(self, key: str) -> float:
        return self.acquire(key)

    async def aclose(self) -> None:
        return None

    def _evict_full(self, now: float) -> None:
        """Forget buckets that have refilled completely (they hold no state worth keeping)."""
        full = [k for k, b in self._buckets.items() if b.tokens + (now - b.updated) * self.rate >= self.burst]
        for key in full:
            del self._buckets[key]


# KEYS[1]: the bucket (a hash: tokens, updated); ARGV: rate, burst. Returns the wait in seconds, as a string
# (a Lua number would reach the client truncated to an integer). The clock is Redis's, shared by all callers.
TOKEN_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local bucket = redis.call('HMGET', KEYS[1], 'tokens', 'updated')
local tokens = tonumber(bucket[1]) or burst
local updated = tonumber(bucket[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - updated) * rate)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'updated', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return tostring(wait)
"""


class RedisTokenBucketLimiter:
    """The token bucket of TokenBucketLimiter, kept in Redis so every API process shares it."""

    def __init__(
        self,
        redis_url: str,
        rate: float,
        burst: int,
        *,
        timeout_s: float = 1.0,
        prefix: str = "stare:ratelimit:",
        fallback: TokenBucketLimiter | None = None,
    ) -> None:
        self.redis_url = redis_url
        self.rate = rate
        self.burst = burst
        self.timeout_s = timeout_s
        self.prefix = prefix
        self.fallback = fallback or TokenBucketLimiter(rate, burst)
        self._redis: tuple[asyncio.AbstractEventLoop, Any, Any] | None = None  # (loop, client, script)
        self._warned_at = -math.inf

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    async def acquire_async(self, key: str) -> float:
        """Take a token: 0.0 when allowed, else the seconds until one is available."""
        if not self.enabled:
            return 0.0
        try:
            _, client, script = self._client()
            wait = await script(keys=[self.prefix + key], args=[repr(self.rate), self.burst], client=client)
            return float(wait)
        except Exception as err:  # Redis is unreachable or failing: limit in this process meanwhile
            now = time.monotonic()
            if now - self._warned_at > 60:
                self._warned_at = now
                logger.warning("rate limiting in process: Redis at the rate limiter failed (%s)", err)
            return self.fallback.acquire(key)

    def _client(self) -> tuple[asyncio.AbstractEventLoop, Any, Any]:
        loop = asyncio.get_running_loop()
        if self._redis is None or self._redis[0] is not loop:
            import redis.asyncio
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            client = redis.asyncio.Redis.from_url(
                self.redis_url,
                socket_timeout=self.timeout_s,
                socket_connect_timeout=self.timeout_s,
                retry=Retry(NoBackoff(), 0),  # no retries: a failure falls back at once
            )
            self._redis = (loop, client, client.register_script(TOKEN_BUCKET_LUA))
        return self._redis

    async def aclose(self) -> None:
        redis, self._redis = self._redis, None
        if redis is not None and redis[0] is asyncio.get_running_loop():
            await redis[1].aclose()


def retry_after_seconds(wait_s: float) -> int:
    return max(1, math.ceil(wait_s))
