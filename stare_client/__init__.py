"""The Python client of the STARE training service (httpx; no torch, nothing of the server).

    from stare_client import Client, AsyncClient

docs/CLIENT.md is the reference; `stare` (stare_client.cli) is the command line over it.
"""

from stare_client.aio import AsyncClient
from stare_client.archive import DownloadedCheckpoint
from stare_client.client import Client, RetryInfo
from stare_client.errors import (
    APIError,
    ArchiveTooLarge,
    AuthError,
    BadRequest,
    ChecksumMismatch,
    ConfigError,
    Conflict,
    ConnectionError,
    JobPaused,
    MergeUnavailable,
    MissingDependency,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    ServerUnavailable,
    StareError,
    UnsafeArchive,
    UntrustedOrigin,
    ValidationError,
    WaitTimeout,
)
from stare_client.states import is_terminal
from stare_client.unpack import ArchiveLimits

__all__ = [
    "APIError",
    "ArchiveLimits",
    "ArchiveTooLarge",
    "AsyncClient",
    "AuthError",
    "BadRequest",
    "ChecksumMismatch",
    "Client",
    "ConfigError",
    "Conflict",
    "ConnectionError",
    "DownloadedCheckpoint",
    "JobPaused",
    "MergeUnavailable",
    "MissingDependency",
    "NotFound",
    "PayloadTooLarge",
    "RateLimited",
    "RetryInfo",
    "ServerError",
    "ServerUnavailable",
    "StareError",
    "UnsafeArchive",
    "UntrustedOrigin",
    "ValidationError",
    "WaitTimeout",
    "is_terminal",
]
