"""Domain errors. Each carries its HTTP status and a stable code; service.app maps them to responses once.

The repository, the storage and the spec checks raise these; none of them knows about HTTP otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


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
