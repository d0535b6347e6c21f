"""Per-API-key token buckets, in process.

Why in process: the service runs as one API process per host (uvicorn, one worker), so one bucket per key
is exact, costs no network round trip per request, and keeps the API answering when Redis is down. With N
API processes each keeps its own buckets (a key gets up to N times the rate); a deployment that scales out
should move the bucket to Redis (a Lua script doing the same arithmetic) behind this same interface.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


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

    def _evict_full(self, now: float) -> None:
        """Forget buckets that have refilled completely (they hold no state worth keeping)."""
        full = [k for k, b in self._buckets.items() if b.tokens + (now - b.updated) * self.rate >= self.burst]
        for key in full:
            del self._buckets[key]


def retry_after_seconds(wait_s: float) -> int:
    return max(1, math.ceil(wait_s))
