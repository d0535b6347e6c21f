"""What the stored state refuses: the errors the repository raises. No HTTP here.

Each error has a stable `code` (the API's error code), a message and, where one field is to blame, the
`param` (a dotted field path or a header name). The API answers them through service.errors, which maps
each class to its HTTP status (NotFound → 404, Conflict → 409, Invalid → 422); the worker never meets them (its writes are
fenced on the lease and return False/None instead of raising).
"""

from __future__ import annotations


class StoreError(Exception):
    code = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class NotFound(StoreError):
    """Nothing stored under the name asked for (an artifact key with no object behind it)."""

    code = "not_found"


class Conflict(StoreError):
    """The object's current state forbids the change (a finished job cancelled, the last key revoked...)."""

    code = "conflict"


class Invalid(StoreError):
    """The request contradicts what is stored (an Idempotency-Key reused for another request)."""

    code = "invalid_request"
