"""Who is calling: the tenant and key behind a request, and a short-lived cache of verified keys.

A verified key is remembered for `ttl_s` seconds (default 5), keyed by its public prefix and checked again
with the constant-time hash comparison on every hit, so most requests authenticate without a database round
trip. Revoking a key through the API forgets it at once in this process; a key revoked elsewhere (another
API process, the command line) stops working within ttl_s. Revoked and unknown keys are never cached. Set
STARE_AUTH_CACHE_TTL_S=0 to look every key up on every request.

The job page's session cookie names its key by id (service.sessions); `get_by_key_id` finds the same entry
through that id, so a cookie and the key it was issued for share one entry, one expiry and one `forget`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from store import keys
from store.models import ApiKey, Tenant


@dataclass(frozen=True)
class TenantRef:
    id: str
    name: str
    created_at: datetime


@dataclass(frozen=True)
class KeyRef:
    id: str
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


@dataclass(frozen=True)
class Principal:
    tenant: TenantRef
    key: KeyRef

    @classmethod
    def of(cls, key: ApiKey, tenant: Tenant) -> Principal:
        return cls(
            TenantRef(tenant.id, tenant.name, tenant.created_at),
            KeyRef(key.id, key.name, key.prefix, key.created_at, key.last_used_at, key.revoked_at),
        )


@dataclass(frozen=True)
class _Entry:
    key_hash: str
    principal: Principal
    expires: float


class PrincipalCache:
    def __init__(
        self, ttl_s: float, *, clock: Callable[[], float] = time.monotonic, max_entries: int = 10_000
    ) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.max_entries = max_entries
        self._entries: dict[str, _Entry] = {}
        self._prefixes: dict[str, str] = {}  # key id -> prefix, for sessions (which carry the id)
        self._lock = threading.Lock()

    def get(self, presented: str) -> Principal | None:
        if self.ttl_s <= 0 or not keys.looks_like_key(presented):
            return None
        entry = self._entries.get(keys.key_prefix(presented))
        if entry is None or entry.expires < self.clock() or not keys.key_matches(presented, entry.key_hash):
            return None
        return entry.principal

    def get_by_key_id(self, key_id: str, tenant_id: str) -> Principal | None:
        """The cached principal of a key named by its id (a verified session cookie names it so)."""
        if self.ttl_s <= 0:
            return None
        prefix = self._prefixes.get(key_id)
        entry = self._entries.get(prefix) if prefix is not None else None
        if entry is None or entry.expires < self.clock():
            return None
        principal = entry.principal
        return principal if principal.key.id == key_id and principal.tenant.id == tenant_id else None

    def put(self, key_hash: str, principal: Principal) -> None:
        if self.ttl_s <= 0 or principal.key.revoked_at is not None:
            return
        with self._lock:
            if len(self._entries) >= self.max_entries:
                now = self.clock()
                for prefix in [p for p, e in self._entries.items() if e.expires < now]:
                    self._pop(prefix)
                if len(self._entries) >= self.max_entries:
                    self._entries.clear()
                    self._prefixes.clear()
            self._entries[principal.key.prefix] = _Entry(key_hash, principal, self.clock() + self.ttl_s)
            self._prefixes[principal.key.id] = principal.key.prefix

    def forget(self, prefix: str) -> None:
        with self._lock:
            self._pop(prefix)

    def _pop(self, prefix: str) -> None:
        entry = self._entries.pop(prefix, None)
        if entry is not None:
            self._prefixes.pop(entry.principal.key.id, None)
