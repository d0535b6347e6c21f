"""The API's errors. Each carries its HTTP status and a stable code; service.app turns them into responses
in one handler.

The storage, the spec checks and the dependencies raise these. The repository (store) raises
store.errors (Conflict, Invalid), which carry no HTTP status: `http_error` maps them here, once
(STORE_ERRORS), and service.app answers both through the same handler.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from store import errors as store_errors


def error_body(
    code: str, message: str, param: str | None = None, details: Sequence[Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """The one error shape every 4xx/5xx has: {"error": {"code", "message", "param"[, "details"]}}."""
    error: dict[str, Any] = {"code": code, "message": message, "param": param}
    if details:
        error["details"] = [dict(d) for d in details]
    return {"error": error}


class ServiceError(Exception):
    status_code = 400
    code = "invalid_request"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        details: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = dict(headers or {})
        self.details = list(details) if details else None


class BadRequest(ServiceError):
    status_code = 400
    code = "invalid_request"


class Unauthenticated(ServiceError):
    status_code = 401
    code = "invalid_api_key"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message, code=code, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(ServiceError):
    """Authenticated, but the request lacks what this use of the credential needs (the page's CSRF token)."""

    status_code = 403
    code = "forbidden"


class NotFound(ServiceError):
    """Missing, or owned by another tenant: the two are indistinguishable on purpose."""

    status_code = 404
    code = "not_found"


class Conflict(ServiceError):
    status_code = 409
    code = "conflict"


class PayloadTooLarge(ServiceError):
    status_code = 413
    code = "payload_too_large"


class UnsupportedMediaType(ServiceError):
    status_code = 415
    code = "unsupported_media_type"


class Unprocessable(ServiceError):
    status_code = 422
    code = "invalid_request"


class TooManyRequests(ServiceError):
    status_code = 429
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: int, code: str | None = None) -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(max(1, retry_after_s))})


class Unavailable(ServiceError):
    status_code = 503
    code = "service_unavailable"

    def __init__(self, message: str, *, code: str | None = None, retry_after_s: int = 5) -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(retry_after_s)})


# The repository's errors (store.errors, no HTTP there) and the API error each one answers as.
STORE_ERRORS: dict[type[store_errors.StoreError], type[ServiceError]] = {
    store_errors.NotFound: NotFound,
    store_errors.Conflict: Conflict,
    store_errors.Invalid: Unprocessable,
    store_errors.StoreError: Unprocessable,
}


def http_error(exc: Exception) -> ServiceError:
    """The API error an exception answers as: a ServiceError itself, a store error mapped by its class."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, store_errors.StoreError):
        for cls in type(exc).__mro__:
            if cls in STORE_ERRORS:
                return STORE_ERRORS[cls](exc.message, param=exc.param, code=exc.code)
    raise TypeError(f"not an API error: {exc!r}") from exc
