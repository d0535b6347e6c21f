"""What the sync and async clients share about HTTP: which requests may be retried and how long to wait,
turning responses into objects or exceptions, the Server-Sent Events parser, and the multipart body of an
upload (streamed, with a progress callback).

Retries: connection errors, 429 and 503 (and 502/504 from a proxy), with exponential backoff and jitter,
honouring Retry-After; only for requests that are safe to repeat: GETs, and POSTs that carry an
Idempotency-Key. Anything else is sent once.

Credentials: the API key is attached per request by OriginBearer, and only to the configured API's origin
(scheme, host, port); a request anywhere else (a download URL or redirect on another host) carries none.
Downloads follow redirects themselves, hop by hop, each hop checked by DownloadPolicy.
"""

from __future__ import annotations

import email.utils
import json
import os
import random
import re
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

import httpx
from pydantic import BaseModel

from stare_client import errors

T = TypeVar("T", bound=BaseModel)
RETRY_STATUSES = frozenset({429, 502, 503, 504})
MAX_RETRY_AFTER_S = 120.0
USER_AGENT = "stare-client/0.1"

ProgressCallback = Callable[[int, int], None]
"""progress(bytes_done, bytes_total)"""


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 5
    backoff_s: float = 0.5  # the first wait; doubles each time
    max_backoff_s: float = 10.0

    def delay(self, attempt: int, retry_after_s: float | None) -> float:
        """Seconds before retry number `attempt` (1-based): Retry-After when the server sent it, else
        exponential backoff with full jitter."""
        if retry_after_s is not None:
            return min(max(retry_after_s, 0.0), MAX_RETRY_AFTER_S)
        ceiling = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return random.uniform(ceiling / 2, ceiling)


# --------------------------------------------------------------------------------------------- credentials

Origin = tuple[str, str, int]
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_REDIRECTS = 5


def origin_of(url: httpx.URL | str) -> Origin:
    """(scheme, host, port) with the scheme's default port made explicit, so http://h and http://h:80 agree."""
    parsed = httpx.URL(url)
    scheme = parsed.scheme.lower()
    return scheme, parsed.host.lower(), parsed.port or DEFAULT_PORTS.get(scheme, 0)


class OriginBearer(httpx.Auth):
    """The API key as a Bearer token on requests to the API's own origin, and on no other."""

    def __init__(self, api_key: str, base_url: str) -> None:
        self._header = f"Bearer {api_key}"
        self.origin = origin_of(base_url)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if origin_of(request.url) == self.origin:
            request.headers["Authorization"] = self._header
        else:
            request.headers.pop("Authorization", None)
        yield request


@dataclass(frozen=True)
class DownloadPolicy:
    """Where a checkpoint may be fetched from: the API's origin (with the key), or an origin the caller named
    in `download_origins` (without it: a pre-signed object-store URL needs none). Anything else is refused
    before a request is made, whether the listing names it or a redirect leads there."""

    base_url: str
    trusted: frozenset[Origin]

    @classmethod
    def of(cls, base_url: str, download_origins: Iterable[str] = ()) -> DownloadPolicy:
        return cls(base_url, frozenset(origin_of(o) for o in download_origins))

    def resolve(self, url: str, via: httpx.URL | None = None) -> str:
        """`url` once its origin is allowed: a path of the API as it is (the client joins it to the base URL,
        path prefix included), anything else made absolute against `via` (a redirect's response URL)."""
        if via is None and httpx.URL(url).is_relative_url and not url.startswith("//"):
            return url
        target = (via or httpx.URL(self.base_url)).join(url)
        origin = origin_of(target)
        if origin != origin_of(self.base_url) and origin not in self.trusted:
            how = f"a redirect from {via}" if via is not None else "the checkpoint's download_url"
            raise errors.UntrustedOrigin(
                f"{how} points at {origin[0]}://{origin[1]}:{origin[2]}, not the API's origin; refused "
                "(pass download_origins=[...] to fetch from it without the API key)",
                code="untrusted_origin",
                param="download_url",
            )
        return str(target)


def redirect_target(response: httpx.Response) -> str | None:
    """The Location of a redirect response, else None."""
    return response.headers["location"] if response.is_redirect else None


def retry_safe(method: str, headers: httpx.Headers | dict[str, str] | None) -> bool:
    if method.upper() in ("GET", "HEAD"):
        return True
    if method.upper() == "POST" and headers is not None:
        return any(k.lower() == "idempotency-key" for k in headers)
    return False


def retry_after(response: httpx.Response) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def new_idempotency_key() -> str:
    return f"stare-client-{uuid.uuid4().hex}"


def connection_error(err: httpx.HTTPError, url: str) -> errors.ConnectionError:
    reason = str(err) or type(err).__name__
    if isinstance(err, httpx.TimeoutException):
        reason = f"timed out ({type(err).__name__})"
    return errors.ConnectionError(f"cannot reach {url}: {reason}", code="connection_error")


RETRYABLE_ERRORS = (httpx.TransportError,)

MAX_RESPONSE_BYTES = 64 * 1024 * 1024
"""The most the client reads of any response it holds in memory (JSON, text, the report's HTML, an error's
body), counted after decompression: a larger one is a StareError (code response_too_large) once the limit
is passed, or at once when its Content-Length says so. `Client(max_response_bytes=...)` changes it.
Checkpoint downloads are streamed to disk and bounded by ArchiveLimits instead; event streams line by line
(MAX_EVENT_LINE_BYTES, MAX_EVENT_BYTES)."""


def response_too_large(response: httpx.Response, limit: int) -> errors.StareError:
    request = response.request
    return errors.StareError(
        f"the response to {request.method} {request.url.path} is larger than {limit} bytes "
        "(max_response_bytes); refused",
        code="response_too_large",
    )


def declared_too_large(response: httpx.Response, limit: int) -> bool:
    try:
        return int(response.headers.get("content-length", "0")) > limit
    except ValueError:
        return False


class BoundedBody:
    """The decoded bytes of a body, at most `limit` of them: the raw (still encoded) chunks go through a
    decoder that never makes more than the room left (zlib's max_length), so a gzip bomb is refused after
    `limit` bytes, not after its whole first network chunk has been inflated (httpx's own decoding would
    make ~64 MiB of one 64 KiB chunk of a bomb). The client asks for `identity`; a server that compresses
    anyway may use gzip or deflate, nothing else."""

    def __init__(self, response: httpx.Response, limit: int) -> None:
        self.response, self.limit = response, limit
        if declared_too_large(response, limit) and not response.headers.get("content-encoding"):
            raise response_too_large(response, limit)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("", "identity"):
            self._inflate: Any = None
        elif encoding in ("gzip", "x-gzip", "deflate"):
            self._inflate = zlib.decompressobj(zlib.MAX_WBITS | (16 if "gzip" in encoding else 0))
        else:
            raise errors.StareError(
                f"the response to {response.request.url.path} is encoded as {encoding!r}, which this client "
                "does not read (it asks for identity)",
                code="bad_response",
            )
        self.parts: list[bytes] = []
        self.size = 0

    def feed(self, raw: bytes) -> None:
        if self._inflate is None:
            self._keep(raw)
            return
        data = raw
        while data:
            out = self._inflate.decompress(data, self.limit - self.size + 1)
            self._keep(out)
            data = self._inflate.unconsumed_tail

    def _keep(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise response_too_large(self.response, self.limit)
        self.parts.append(chunk)

    def finish(self) -> None:
        if self._inflate is not None:
            self._keep(self._inflate.flush())
        self.response._content = b"".join(self.parts)  # what httpx's own read() sets


def keep_bounded(response: httpx.Response, raw_chunks: Iterable[bytes], limit: int) -> None:
    """Read a streamed response's body into it (`response.content`, `.json()`, `.text` then work), at most
    `limit` decoded bytes; StareError past it, before more is held. `raw_chunks`: response.iter_raw(). The
    caller closes the response."""
    body = BoundedBody(response, limit)
    for chunk in raw_chunks:
        body.feed(chunk)
    body.finish()


async def akeep_bounded(response: httpx.Response, raw_chunks: AsyncIterator[bytes], limit: int) -> None:
    """keep_bounded for the async client (`raw_chunks`: response.aiter_raw())."""
    body = BoundedBody(response, limit)
    async for chunk in raw_chunks:
        body.feed(chunk)
    body.finish()


def raise_for_error(response: httpx.Response) -> None:
    """An APIError (subclass by status) for a 4xx/5xx response whose body has been read."""
    if response.status_code < 400:
        return
    body: Any
    try:
        body = response.json()
    except ValueError:
        body = response.text
    raise errors.api_error(response.status_code, body, retry_after(response))


def parse(model: type[T], response: httpx.Response) -> T:
    raise_for_error(response)
    try:
        return model.model_validate(response.json())
    except ValueError as err:
        raise errors.StareError(
            f"unexpected response from {response.request.url}: {err}", code="bad_response"
        ) from err


# --------------------------------------------------------------------------------------- server-sent events


MAX_EVENT_LINE_BYTES = 1024 * 1024
"""The longest line of an event stream the client reads (the server's events are a few KiB); a longer one
is a StareError (code event_too_large) before more of it is held."""
MAX_EVENT_BYTES = 4 * 1024 * 1024
"""The most one stream message (all its lines until the blank line) may hold, counted in characters of its
decoded lines (each line is already at most MAX_EVENT_LINE_BYTES bytes)."""


def too_large(what: str, limit: int) -> errors.StareError:
    return errors.StareError(
        f"the event stream sent {what} longer than {limit} bytes; refused (the server is not one this client "
        "can trust)",
        code="event_too_large",
    )


LINE_BREAK = re.compile(rb"\r\n|\r|\n")


@dataclass
class LineSplitter:
    """Bytes in, text lines out (a line ends at CRLF, LF or CR, as text/event-stream says), holding at most
    `max_line_bytes` of a line not yet ended: an endless line is an error, not memory."""

    max_line_bytes: int = MAX_EVENT_LINE_BYTES
    _pending: bytearray = field(default_factory=bytearray)
    _after_cr: bool = False

    def feed(self, chunk: bytes) -> list[str]:
        lines: list[str] = []
        start = 1 if self._after_cr and chunk[:1] == b"\n" else 0  # the LF of a CRLF cut between chunks
        for brk in LINE_BREAK.finditer(chunk, start):
            self._take(chunk[start : brk.start()])
            lines.append(self._pending.decode("utf-8", "replace"))
            self._pending.clear()
            start = brk.end()
        self._after_cr = start == len(chunk) and chunk.endswith(b"\r")
        self._take(chunk[start:])
        return lines

    def _take(self, piece: bytes) -> None:
        if len(self._pending) + len(piece) > self.max_line_bytes:
            raise too_large("a line", self.max_line_bytes)
        self._pending += piece

    def end(self) -> list[str]:
        """The last line when the body did not end with a line break."""
        line = self._pending.decode("utf-8", "replace") if self._pending else None
        self._pending.clear()
        return [line] if line is not None else []


def bounded_lines(chunks: Iterable[bytes], max_line_bytes: int = MAX_EVENT_LINE_BYTES) -> Iterator[str]:
    splitter = LineSplitter(max_line_bytes)
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.end()


async def abounded_lines(
    chunks: AsyncIterator[bytes], max_line_bytes: int = MAX_EVENT_LINE_BYTES
) -> AsyncIterator[str]:
    splitter = LineSplitter(max_line_bytes)
    async for chunk in chunks:
        for line in splitter.feed(chunk):
            yield line
    for line in splitter.end():
        yield line


@dataclass
class SSEMessage:
    event: str = "message"
    data: str = ""
    id: str | None = None


@dataclass
class SSEParser:
    """Incremental text/event-stream parsing (the WHATWG rules that matter here: `field: value` lines, a
    blank line ends a message, `:` lines are comments, data lines join with newlines)."""

    max_event_bytes: int = MAX_EVENT_BYTES
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str | None = None
    _held: int = 0  # characters of the message so far (its lines and their line breaks)

    def feed_line(self, line: str) -> SSEMessage | None:
        line = line.rstrip("\r\n")
        if not line:
            if not self._data and not self._event and self._id is None:
                return None
            message = SSEMessage(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data, self._id, self._held = "", [], None, 0
            return message
        if line.startswith(":"):
            return None
        self._held += len(line) + 1
        if self._held > self.max_event_bytes:
            raise too_large("one event", self.max_event_bytes)
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None  # "retry" and unknown fields: ignored (the client has its own backoff)


def decode_event(message: SSEMessage) -> dict[str, Any] | None:
    """The event object of a stream message, or None for a message without one."""
    if not message.data:
        return None
    try:
        value = json.loads(message.data)
    except ValueError as err:
        raise errors.StareError(f"malformed event in the stream: {message.data[:200]!r}") from err
    return value if isinstance(value, dict) else None


# ------------------------------------------------------------------------------------------------- upload


@dataclass
class MultipartUpload(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A multipart/form-data body with one `purpose` field and one `file`, streamed from an open file in
    chunks; `progress(sent, total)` after each file chunk. Its size is known up front (Content-Length), so
    the server can refuse an oversized file before reading it. A byte stream for both httpx clients, so one
    upload operation serves the sync and the async client."""

    fh: IO[bytes]
    filename: str
    purpose: str
    progress: ProgressCallback | None = None
    chunk_bytes: int = 256 * 1024
    boundary: str = field(default_factory=lambda: f"stare-{uuid.uuid4().hex}")

    def __post_init__(self) -> None:
        self.fh.seek(0, os.SEEK_END)
        self.file_bytes = self.fh.tell()
        self.fh.seek(0)
        safe_name = self.filename.replace('"', "_").replace("\r", "_").replace("\n", "_")
        b = self.boundary
        self.head = (
            f'--{b}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n{self.purpose}\r\n'
            f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="{safe_name}"\r\n'
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode()
        self.tail = f"\r\n--{b}--\r\n".encode()

    @property
    def headers(self) -> dict[str, str]:
        return {
            "Content-Type": f"multipart/form-data; boundary={self.boundary}",
            "Content-Length": str(len(self.head) + self.file_bytes + len(self.tail)),
        }

    def chunks(self) -> Iterator[bytes]:
        yield self.head
        sent = 0
        if self.progress is not None:
            self.progress(0, self.file_bytes)
        while chunk := self.fh.read(self.chunk_bytes):
            sent += len(chunk)
            yield chunk
            if self.progress is not None:
                self.progress(sent, self.file_bytes)
        yield self.tail

    def __iter__(self) -> Iterator[bytes]:
        return self.chunks()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks():
            yield chunk


def job_id_of(job: Any) -> str:
    """A job id from an id or an object with `.id` (a Job)."""
    value = getattr(job, "id", job)
    if not isinstance(value, str) or not value:
        raise errors.ConfigError(f"not a job or job id: {job!r}", param="job_id")
    return value


def spec_body(
    spec: dict[str, Any], training_file: str | None, metadata: dict[str, str] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"spec": spec}
    if training_file is not None:
        body["training_file"] = training_file
    if metadata is not None:
        body["metadata"] = metadata
    return body
