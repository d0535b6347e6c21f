"""The request boundary: one ASGI middleware that every request passes before any route sees it.

It refuses, in the error shape and before anything is read from or written to the database:
- a body over the size limit: 413 at once from Content-Length, else while reading (file uploads have
  their own, larger limit and count the file part exactly themselves);
- a NUL character (or a lone surrogate) in the path, a query parameter or a header: 422 naming the path or
  query parameter, 400 naming the header;
- a JSON body that breaks contract.safejson's rules (NUL or lone surrogate in any string or key, NaN or
  infinite numbers, integers over 64 digits, nesting deeper than 32): 422 naming the field as a dotted path.

So no route has to guard its own strings: PostgreSQL never sees a NUL, no float column or JSON document
gets an infinity, and POST /v1/jobs/estimate and POST /v1/jobs answer the same body the same way. Dataset
lines are checked with the same rules by trainer.tasks.sources (the upload's line checker), spec files by
contract.spec.load_spec.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contract import safejson
from service.errors import error_body

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


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
    ) -> None:
        self.app = app
        self.path_templates = path_templates  # e.g. "/v1/jobs/{job_id}" (the OpenAPI paths)
        self._templates: list[re.Pattern[str]] | None = None
        self.max_bytes = max_bytes
        self.upload_path = upload_path
        self.max_upload_bytes = max_upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = self._check_request_line(scope)
        if refused is not None:
            await refused(scope, receive, send)
            return
        limit = self.max_upload_bytes if scope.get("path") == self.upload_path else self.max_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await error_response(413, "payload_too_large", f"the request body is larger than {limit} bytes")(
                scope, receive, send
            )
            return
        if scope.get("method") in BODY_METHODS and _is_json(scope):
            await self._json_request(scope, receive, send, limit)
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

    async def _json_request(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
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
        if body:
            try:
                safejson.loads(body)
            except safejson.UnsafeDocument as err:
                await error_response(422, err.problem.code, str(err), err.problem.where or None)(
                    scope, receive, send
                )
                return
            except ValueError:
                pass  # not JSON at all: the route's own parsing answers that (422 invalid_json)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


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
