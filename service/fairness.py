"""A fair gate in front of a shared pool: one call at a time per tenant, a bounded queue per tenant, and a
freed slot goes to the waiting tenant served least recently (issue 44, R4).

Before, the task-check pool was one semaphore: two tenants' slow estimates, queued first, held both children
for their whole budgets while a third tenant's trivial estimate waited behind all of them (38.6 s). Here a
tenant holds at most one slot whatever it sends, its further calls wait in its own queue (past `queue` of
them: `QueueFull`, a 429), and a tenant that has not been served yet goes before one that has. So with
`slots` slots, `slots - 1` tenants with slow calls leave the last slot to everyone else, and a tenant's
slow calls delay only that tenant.

Event-loop only (anyio): no thread touches the gate. Reusable for any pool a request reaches.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import deque
from collections.abc import AsyncIterator

import anyio


class QueueFull(Exception):
    """The tenant already has a call running and `queue` waiting."""

    def __init__(self, queue: int) -> None:
        super().__init__(f"at most one call per tenant runs at a time and {queue} wait; retry later")
        self.queue = queue


@dataclasses.dataclass
class _Tenant:
    running: bool = False
    waiting: deque[anyio.Event] = dataclasses.field(default_factory=deque)
    served: int = -1  # the grant counter at its last grant (-1: never served)


class FairGate:
    def __init__(self, slots: int, queue: int) -> None:
        self.slots, self.queue = slots, queue
        self._free = slots
        self._tenants: dict[str, _Tenant] = {}
        self._grants = 0

    @property
    def running(self) -> int:
        return self.slots - self._free

    def waiting(self, tenant: str) -> int:
        state = self._tenants.get(tenant)
        return len(state.waiting) if state is not None else 0

    @contextlib.asynccontextmanager
    async def hold(self, tenant: str) -> AsyncIterator[None]:
        """A slot for `tenant` for the block's duration; QueueFull when its queue is full."""
        await self.acquire(tenant)
        try:
            yield
        finally:
            self.release(tenant)

    async def acquire(self, tenant: str) -> None:
        """Wait for a slot for `tenant` (QueueFull when its queue is full); `release` gives it back."""
        state = self._tenants.setdefault(tenant, _Tenant())
        if not state.running and self._free > 0:
            self._grant(state)
            return
        if len(state.waiting) >= self.queue:
            self._forget_if_idle(tenant)
            raise QueueFull(self.queue)
        granted = anyio.Event()
        state.waiting.append(granted)
        try:
            await granted.wait()
        except BaseException:  # cancelled (the client went away): leave the queue, or give back
            if granted in state.waiting:
                state.waiting.remove(granted)
                self._forget_if_idle(tenant)
            else:
                self.release(tenant)
            raise

    def release(self, tenant: str) -> None:
        state = self._tenants[tenant]
        state.running = False
        self._free += 1
        self._dispatch()
        self._forget_if_idle(tenant)

    def _grant(self, state: _Tenant) -> None:
        state.running = True
        self._free -= 1
        self._grants += 1
        state.served = self._grants

    def _dispatch(self) -> None:
        while self._free > 0:
            ready = [state for state in self._tenants.values() if not state.running and state.waiting]
            if not ready:
                return
            state = min(ready, key=lambda s: s.served)
            granted = state.waiting.popleft()
            self._grant(state)
            granted.set()

    def _forget_if_idle(self, tenant: str) -> None:
        state = self._tenants.get(tenant)
        if state is not None and not state.running and not state.waiting:
            del self._tenants[tenant]
