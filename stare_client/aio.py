"""The asyncio client: `AsyncClient` has the same namespaces and methods as `stare_client.Client`, each a
coroutine (or an async iterator for lists and event streams). Nothing here but the connection: the
operations are the ones in stare_client.resources, run by stare_client.driver.AsyncDriver.

    async with AsyncClient() as stare:
        job = await stare.jobs.create(spec)
        async for event in stare.jobs.events(job):
            ...
        job = await stare.jobs.wait(job, timeout=600)
"""

from __future__ import annotations

from typing import Any

import httpx

from stare_client.client import BaseClient
from stare_client.driver import Async, AsyncDriver


class AsyncClient(BaseClient[Async]):
    """See `stare_client.Client`; the same arguments. An async context manager."""

    http: httpx.AsyncClient

    def _connect(self, **http_options: Any) -> None:
        self.http = httpx.AsyncClient(**http_options)
        self._driver = AsyncDriver(self.http, self.max_response_bytes)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()
