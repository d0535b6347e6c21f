"""The request boundary: one ASGI middleware that every request passes before any route sees it.

In this order, and in the error shape, before anything is read from or written to the database:
- a NUL character (or a lone surrogate) in the path, a query parameter or a header: 422 naming the path or
  query parameter, 400 naming the header;
- a body over the size limit: 413 at once from Content-Length, else while reading (file uploads have
  their own, larger limit and count the file part exactly themselves);
- authentication and the rate limits, for every /v1 request, from its headers alone (issue 44, R3): a
  missing, wrong or revoked key or session is a 401, a key, tenant or source address past its rate a 429,
  each before a byte of the body is read; so is a sign-in (POST /ui/session: its source address's bucket,
  and a body of at most SIGN_IN_MAX_BYTES). No other path's body is parsed here;
- a JSON body that breaks contract.safejson's rules (NUL or lone surrogate in any string or key, NaN or
  infinite numbers, integers over 64 digits, nesting deeper than 32, more than `max_values` values): 422
  naming the field as a dotted path. The check is linear in the body's size and mostly in C; a large body
  is checked in another process (service/body_checks.py), so not even the interpreter lock is held for it.

So no route has to guard its own strings: PostgreSQL never sees a NUL, no float column or JSON document
gets an infinity, and POST /v1/jobs/estimate and POST /v1/jobs answer the same body the same way. Dataset
lines are checked with the same rules by trainer.tasks.sources (the upload's line checker), spec files by
contract.spec.load_spec.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contract import safejson
from service.errors import error_body
from service.fairness import FairGate, QueueFull

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
AUTHENTICATED_PREFIX = "/v1/"  # every route under it needs a key or a session (the OpenAPI schema says so)
SIGN_IN_PATH = "/ui/session"
SIGN_IN_MAX_BYTES = 4096

# A JSON body past SMALL_BODY_BYTES (or of no announced length) waits for one of LARGE_BODY_SLOTS, one per
# tenant (service/fairness.py): reading, checking and parsing 1 MiB costs the loop a few milliseconds, and
# without a bound the bodies a few tenants send at their rate limits queue up ahead of everyone's requests.
SMALL_BODY_BYTES = 64 * 1024
LARGE_BODY_SLOTS = 2
LARGE_BODY_QUEUE = 8

# Authenticates a request from its scope (headers, cookies, client): raises a ServiceError (401, 403, 429).
Gate = Callable[[Scope], Awaitable[object]]
Handler = Callable[[Request, Any], Response | Awaitable[Response]]


def error_response(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(code, message, param), status_code=status)


def _text_problem(text: str, what: str) -> str | None:
    if "\x00" in text:
        return f"{what} contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} contains a lone surrogate (not valid UTF-8)"
    return None


def _escaped(name: str) -> str:
    return safejson.dotted([name])


class RequestBoundary:
    def __init__(
        self,
        app: ASGIApp,
        *,
        path_templates: Callable[[], Iterable[str]],
        max_bytes: int,
        upload_path: str,
        max_upload_bytes: int,
        authenticate: Gate | None = None,
        sign_in_gate: Gate | None = None,
        exception_handlers: Callable[[], Mapping[Any, Handler]] = dict,
        check_body: Callable[[bytes], Awaitable[safejson.Problem | None]] | None = None,
    ) -> None:
        self.app = app
        self.path_templates = path_templates  # e.g. "/v1/jobs/{job_id}" (the OpenAPI paths)
        self._templates: list[re.Pattern[str]] | None = None
        self.max_bytes = max_bytes
        self.upload_path = upload_path
        self.max_upload_bytes = max_upload_bytes
        self.authenticate = authenticate  # a /v1 request's caller, before its body (None: routes do it)
        self.sign_in_gate = sign_in_gate  # a sign-in's source-address token, before its body
        self.exception_handlers = exception_handlers  # the app's, for what the gates raise
        self.large_bodies = FairGate(LARGE_BODY_SLOTS, LARGE_BODY_QUEUE)
        self.check_body = check_body or _check_inline  # service/body_checks.py: large bodies elsewhere

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = self._check_request_line(scope)
        if refused is None:
            refused = await self._gate(scope)
        if refused is not None:
            await refused(scope, receive, send)
            return
        path, method = scope.get("path", ""), scope.get("method")
        limit = self.max_upload_bytes if path == self.upload_path else self.max_bytes
        parsed_here = path.startswith(AUTHENTICATED_PREFIX) or path == SIGN_IN_PATH
        if path == SIGN_IN_PATH:
            limit = min(limit, SIGN_IN_MAX_BYTES)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await error_response(413, "payload_too_large", f"the request body is larger than {limit} bytes")(
                scope, receive, send
            )
            return
        if method in BODY_METHODS and parsed_here and _is_json(scope):
            if declared is not None and declared <= SMALL_BODY_BYTES:
                await self._json_request(scope, receive, send, limit)
                return
            await self._large_json_request(scope, receive, send, limit)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, f"the request body is larger than {limit} bytes")
            return message

        await self.app(scope, limited_receive, send)

    async def _gate(self, scope: Scope) -> JSONResponse | None:
        """Authentication and rate limits before any body is read: a /v1 request's caller, a sign-in's
        source-address token. A refusal is the response to send (its body never read)."""
        path = scope.get("path", "")
        gate = None
        if path.startswith(AUTHENTICATED_PREFIX):
            gate = self.authenticate
        elif path == SIGN_IN_PATH and scope.get("method") == "POST":
            gate = self.sign_in_gate
        if gate is None:
            return None
        try:
            await gate(scope)
        except Exception as exc:  # answered as a route's would be (a database outage: 503, not 500)
            handler = _handler_for(exc, self.exception_handlers())
            if handler is None:
                raise
            response = handler(Request(scope), exc)
            answer = await response if inspect.isawaitable(response) else response
            assert isinstance(answer, JSONResponse)
            return answer
        return None

    # ------------------------------------------------------------------------------------ path, query, headers

    def _check_request_line(self, scope: Scope) -> JSONResponse | None:
        path = scope.get("path", "")
        problem = _text_problem(path, "the path")
        if problem is not None:
            name = self._path_param(scope)
            return error_response(422, "invalid_characters", f"{name}: {problem}", name)
        query = scope.get("query_string", b"")
        if query:
            for key, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
                for text, what in ((key, "the parameter name"), (value, "the value")):
                    problem = _text_problem(text, what)
                    if problem is not None:
                        name = _escaped(key)
                        return error_response(422, "invalid_characters", f"{name}: {problem}", name)
        for raw_name, raw_value in scope.get("headers", ()):
            if b"\x00" in raw_name or b"\x00" in raw_value:
                name = _escaped(raw_name.decode("latin-1"))
                return error_response(400, "invalid_header", f"header {name} contains a NUL character", name)
        return None

    def _path_param(self, scope: Scope) -> str:
        """The name of the path parameter that holds the bad character, or 'path' when no route matches.
        Only on this error path: the documented path templates, matched one by one."""
        if self._templates is None:
            self._templates = [_template_pattern(path) for path in self.path_templates()]
        path = scope.get("path", "")
        for pattern in self._templates:
            found = pattern.fullmatch(path)
            if found is not None:
                for name, value in found.groupdict().items():
                    if _text_problem(value, "") is not None:
                        return name
        return "path"

    # --------------------------------------------------------------------------------------------- JSON bodies

    async def _large_json_request(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        """A large body is read, checked and answered a few at a time, one per tenant at a time (its slot
        held to the end: given back as soon as the route has parsed it, the next body's reading overlapped
        the route's work and /healthz waited longer, measured)."""
        whose = _whose(scope)
        try:
            await self.large_bodies.acquire(whose)
        except QueueFull:
            message = (
                f"at most one large request body per tenant is read at a time and {LARGE_BODY_QUEUE} wait"
            )
            await error_response(429, "too_many_large_bodies", f"{message}; retry later")(
                scope, receive, send
            )
            return
        try:
            await self._json_request(scope, receive, send, limit)
        finally:
            self.large_bodies.release(whose)

    async def _json_request(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        limit: int,
        handed_over: Callable[[], None] | None = None,
    ) -> None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away: let the app see the disconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await error_response(
                    413, "payload_too_large", f"the request body is larger than {limit} bytes"
                )(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        problem = await self.check_body(body) if body else None
        if problem is not None:
            text = str(safejson.UnsafeDocument(problem))
            await error_response(422, problem.code, text, problem.where or None)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _whose(scope: Scope) -> str:
    """The authenticated tenant of a request (the boundary's gate put its caller in the scope's state),
    else its source address."""
    caller = scope.get("state", {}).get("stare_caller")
    tenant = getattr(getattr(caller, "principal", None), "tenant", None)
    if tenant is not None:
        return f"tenant:{tenant.id}"
    client = scope.get("client")
    return f"address:{client[0] if client else 'unknown'}"


async def _check_inline(body: bytes) -> safejson.Problem | None:
    from service.body_checks import check

    return check(body, safejson.MAX_VALUES)


def _handler_for(exc: Exception, handlers: Mapping[Any, Handler]) -> Handler | None:
    for kind in type(exc).__mro__:
        if kind in handlers:
            return handlers[kind]
    return None


def _template_pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", template)
    regex = "".join(f"(?P<{part}>[^/]+)" if i % 2 else re.escape(part) for i, part in enumerate(parts))
    return re.compile(regex, re.DOTALL)


def _is_json(scope: Scope) -> bool:
    """FastAPI parses a body as JSON when it has no Content-Type or a JSON one; so do we."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            kind = value.split(b";", 1)[0].strip().lower()
            return kind == b"application/json" or kind.endswith(b"+json")
    return True


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
