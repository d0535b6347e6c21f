"""The synchronous client: `Client(base_url, api_key)` with one namespace per resource (jobs, files,
checkpoints, reports, keys). `stare_client.aio.AsyncClient` is the same API with `await`: both run the one
definition of each operation in stare_client.resources (stare_client.driver says how).

    from stare_client import Client

    with Client() as stare:                      # STARE_API_URL / STARE_API_KEY, or a local stack
        job = stare.jobs.create(spec)            # an Idempotency-Key is generated (and retried safely)
        for event in stare.jobs.events(job):     # survives disconnects: no event lost or repeated
            print(event.type, event.message)
        job = stare.jobs.wait(job, timeout=600)
        ckpt = stare.checkpoints.download(job, "best", "out/best")
        model = AutoModelForCausalLM.from_pretrained(ckpt.path)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from stare_client import models, transport
from stare_client.config import resolve
from stare_client.driver import Bindable, Close, M, Op, ReadBody, Send, Sleep, Sync, SyncDriver, operation
from stare_client.graders import Graders
from stare_client.resources import (
    DEFAULT_TIMEOUT_S,
    RECONNECT_FOR_S,
    STREAM_READ_TIMEOUT_S,
    Checkpoints,
    Files,
    Jobs,
    Keys,
    Reports,
)
from stare_client.transport import RetryPolicy
from stare_client.unpack import DEFAULT_LIMITS, ArchiveLimits

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "RECONNECT_FOR_S",
    "STREAM_READ_TIMEOUT_S",
    "BaseClient",
    "Client",
    "RetryInfo",
]


@dataclass(frozen=True)
class RetryInfo:
    """Passed to `on_retry` before each retry's wait."""

    method: str
    url: str
    attempt: int
    delay_s: float
    reason: str  # "HTTP 429", "HTTP 503", or the connection error


class BaseClient(Bindable[M]):
    """What the sync and async clients share: where to connect, the retry policy, the archive limits and
    download origins, the resources, and the request operation every other one goes through.

    `base_url` and `api_key` default to STARE_API_URL and STARE_API_KEY, then to a local stack's
    `.stare/embedded.json` and `.stare/api-key` (stare_client.config). The key is sent to that origin only.
    `archive_limits` bounds what a checkpoint download may be and unpack to (stare_client.unpack);
    `download_origins` names other origins a checkpoint may be fetched from, without the key;
    `max_response_bytes` bounds every other response the client reads (transport.MAX_RESPONSE_BYTES)."""

    http: httpx.Client | httpx.AsyncClient

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        on_retry: Callable[[RetryInfo], None] | None = None,
        home: str | os.PathLike[str] | None = None,
        archive_limits: ArchiveLimits | None = None,
        download_origins: Iterable[str] = (),
        max_response_bytes: int = transport.MAX_RESPONSE_BYTES,
    ) -> None:
        conn = resolve(base_url, api_key, home=home)
        self.max_response_bytes = max_response_bytes
        self.base_url = conn.base_url
        self.retry = RetryPolicy(max_retries=max_retries, backoff_s=backoff_s)
        self.on_retry = on_retry
        self.archive_limits = archive_limits or DEFAULT_LIMITS
        self.download_policy = transport.DownloadPolicy.of(conn.base_url, download_origins)
        self._connect(
            base_url=conn.base_url,
            auth=transport.OriginBearer(conn.api_key, conn.base_url),
            headers={"User-Agent": transport.USER_AGENT, "Accept-Encoding": "identity"},
            timeout=timeout_s,
        )
        self.jobs: Jobs[M] = Jobs(self)
        self.files: Files[M] = Files(self)
        self.checkpoints: Checkpoints[M] = Checkpoints(self)
        self.reports: Reports[M] = Reports(self)
        self.keys: Keys[M] = Keys(self)
        self.graders: Graders[M] = Graders(self)

    def _connect(self, **http_options: Any) -> None:
        """Open `self.http` and set `self._driver` (each client's own kind)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.base_url}>"

    # ------------------------------------------------------------------------------------------ requests

    @operation
    def send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
        content: Any = None,
        stream: bool = False,
    ) -> Op[httpx.Response]:
        """One request with the retry policy; an APIError for an error status. With `stream`, the body is
        not read (the caller closes the response). `content` may be a byte stream both clients can send
        (transport.MultipartUpload)."""
        safe = transport.retry_safe(method, headers)
        body_stream = isinstance(content, httpx.SyncByteStream | httpx.AsyncByteStream)
        attempt = 0
        while True:
            request = self.http.build_request(
                method,
                path,
                params=params,
                json=json,
                headers=headers,
                content=None if body_stream else content,
            )
            if body_stream:
                request.stream = content
            try:
                response: httpx.Response = yield Send(request, stream)
            except transport.RETRYABLE_ERRORS as err:
                if not safe or attempt >= self.retry.max_retries:
                    raise transport.connection_error(err, self.base_url) from err
                attempt += 1
                yield from self._wait(method, request, attempt, None, type(err).__name__)
                continue
            if response.status_code in transport.RETRY_STATUSES and safe and attempt < self.retry.max_retries:
                yield Close(response)
                attempt += 1
                why = f"HTTP {response.status_code}"
                yield from self._wait(method, request, attempt, transport.retry_after(response), why)
                continue
            if response.status_code >= 400:
                if stream:
                    yield ReadBody(response)
                transport.raise_for_error(response)
            return response

    def _wait(
        self, method: str, request: httpx.Request, attempt: int, retry_after_s: float | None, reason: str
    ) -> Op[None]:
        delay = self.retry.delay(attempt, retry_after_s)
        if self.on_retry is not None:
            self.on_retry(RetryInfo(method, str(request.url), attempt, delay, reason))
        yield Sleep(delay)

    @operation
    def get(self, model: type[transport.T], path: str, **params: Any) -> Op[transport.T]:
        query = {k: v for k, v in params.items() if v is not None}
        return transport.parse(model, (yield from self.send.op("GET", path, params=query or None)))

    @operation
    def me(self) -> Op[models.Me]:
        """The tenant and key behind this client, the tenant's limits and usage."""
        return self.get.op(models.Me, "/v1/me")

    @operation
    def models(self) -> Op[list[models.Model]]:
        """Base models a job may name in spec.model.name."""
        return (yield from self.get.op(models.ModelList, "/v1/models")).data


class Client(BaseClient[Sync]):
    """A blocking connection to the STARE API (BaseClient lists the arguments); a context manager."""

    http: httpx.Client

    def _connect(self, **http_options: Any) -> None:
        self.http = httpx.Client(**http_options)
        self._driver = SyncDriver(self.http, self.max_response_bytes)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()
