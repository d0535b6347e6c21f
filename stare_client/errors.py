"""The client's exceptions: one base class, one subclass per kind of failure a script handles differently.

Errors the API answered carry its error body (`service` sends `{"error": {"code", "message", "param"}}`):
`code` is stable and machine-readable, `param` names the offending field as a dotted path
(`spec.optim.lr`) or header (`Idempotency-Key`).
"""

from __future__ import annotations

from typing import Any


class StareError(Exception):
    """Every error the client raises."""

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param

    def __str__(self) -> str:
        return self.message


class ConfigError(StareError):
    """No API URL or key, or an invalid one (arguments, STARE_API_URL / STARE_API_KEY)."""


class ConnectionError(StareError):  # the client's own; shadows the builtin here only
    """The server could not be reached, or the connection broke (after the retries allowed)."""


class APIError(StareError):
    """The API answered with an error status."""

    status_code: int = 0

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        code: str | None = None,
        param: str | None = None,
        details: list[dict[str, Any]] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, code=code, param=param)
        self.status_code = status_code
        self.details = details or []
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        where = f" ({self.param})" if self.param else ""
        return f"{self.code or 'error'}{where}: {self.message}"


class BadRequest(APIError):
    """400: a malformed request or header."""


class AuthError(APIError):
    """401: a missing, invalid or revoked API key."""


class NotFound(APIError):
    """404: no such object for this tenant."""


class Conflict(APIError):
    """409: the object's state does not allow this (deleting a running job, revoking the last key)."""


class PayloadTooLarge(APIError):
    """413: the body or file is over the server's limit."""


class ValidationError(APIError):
    """422 (and 415): a field is invalid; `param` names it, `details` lists every problem."""


class RateLimited(APIError):
    """429: the rate limit or the active-job limit; `retry_after_s` says when to try again."""


class ServerError(APIError):
    """500 and other 5xx the client does not know."""


class ServerUnavailable(ServerError):
    """503 (database, broker or storage away) and 507 (storage full); `retry_after_s` when sent."""


class WaitTimeout(StareError, TimeoutError):
    """`jobs.wait` ran out of time; `job` is the last state seen."""

    def __init__(self, message: str, job: Any) -> None:
        super().__init__(message, code="wait_timeout")
        self.job = job


class JobPaused(StareError):
    """`jobs.wait(..., on_paused="raise")` found the job paused."""

    def __init__(self, message: str, job: Any) -> None:
        super().__init__(message, code="job_paused")
        self.job = job


class ChecksumMismatch(StareError):
    """A download's SHA-256 or size is not what the server announced; nothing was kept."""


class UnsafeArchive(StareError):
    """A checkpoint archive the client refuses: a member that is a link, a device, an absolute path or `..`,
    a second copy of a path, too many members, too deep a path, a corrupt or truncated archive. Nothing of
    it is left on disk."""


class ArchiveTooLarge(UnsafeArchive):
    """A download or its unpacked tree would pass a cap: the announced size, the client's
    ArchiveLimits, or the compression ratio (a bomb); it was stopped at the cap."""


class UntrustedOrigin(StareError):
    """A download URL (or a redirect) points at an origin other than the API's and not among the
    `download_origins` the client was given; the API key is only ever sent to the API's own origin."""


class MissingDependency(StareError):
    """An optional package (pandas, transformers, peft) is needed for this call and is not installed."""


class MergeUnavailable(StareError):
    """`merged=True` on a LoRA checkpoint without merged weights, and no way to merge it here."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: AuthError,
    403: AuthError,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: ValidationError,
    422: ValidationError,
    429: RateLimited,
    503: ServerUnavailable,
    507: ServerUnavailable,
}


def api_error(status_code: int, body: Any, retry_after_s: float | None = None) -> APIError:
    """The exception for an error response: its class from the status, its fields from the error body (a
    body in another shape, e.g. from a proxy, still gives a message)."""
    cls = _BY_STATUS.get(status_code) or (ServerError if status_code >= 500 else APIError)
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        message = str(error.get("message") or f"HTTP {status_code}")
        code = error.get("code")
        param = error.get("param")
        details = error.get("details")
    else:
        text = body if isinstance(body, str) else ""
        message = (text.strip().splitlines() or [f"HTTP {status_code}"])[0][:300]
        code, param, details = f"http_{status_code}", None, None
    return cls(
        message,
        status_code=status_code,
        code=str(code) if code is not None else None,
        param=str(param) if param is not None else None,
        details=details if isinstance(details, list) else None,
        retry_after_s=retry_after_s,
    )
