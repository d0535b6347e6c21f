"""Where the client connects and with which key: arguments, then STARE_API_URL / STARE_API_KEY, then a local
embedded stack (`stare local up` writes `<home>/embedded.json` and `<home>/api-key`; home is $STARE_HOME or
`.stare`)."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from stare_client.errors import ConfigError

URL_ENV = "STARE_API_URL"
KEY_ENV = "STARE_API_KEY"
HOME_ENV = "STARE_HOME"
DEFAULT_HOME = ".stare"


@dataclass(frozen=True)
class Connection:
    base_url: str
    api_key: str
    source: str  # where they came from, for messages: "arguments", "environment", "<home>/embedded.json"


def local_home(home: str | os.PathLike[str] | None = None) -> Path:
    return Path(home or os.environ.get(HOME_ENV) or DEFAULT_HOME)


def read_local(home: Path) -> tuple[str | None, str | None]:
    """(url, key) of a local stack under `home`, or Nones when it has not written them."""
    url = key = None
    try:
        info = json.loads((home / "embedded.json").read_text())
        if isinstance(info, dict):
            # "api" is the API's base URL; older files had only "url" (then the API's base too)
            found = info.get("api") or info.get("url")
            if isinstance(found, str):
                url = _api_base(found)
    except (OSError, ValueError):
        pass
    with contextlib.suppress(OSError):
        key = (home / "api-key").read_text().strip() or None
    return url, key


def _api_base(url: str) -> str:
    """The API's base URL from a stored URL that may point at a page under it (`.../ui/jobs`)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else url


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"the API URL must look like http://host:port, got {url!r}", param="base_url")
    return url.rstrip("/")


def resolve(
    base_url: str | None = None, api_key: str | None = None, *, home: str | os.PathLike[str] | None = None
) -> Connection:
    """The URL and key to use; ConfigError naming what to set when either is missing."""
    source = "arguments"
    url = base_url or os.environ.get(URL_ENV) or None
    key = api_key or os.environ.get(KEY_ENV) or None
    if (base_url is None and url) or (api_key is None and key):
        source = "environment"
    if url is None or key is None:
        folder = local_home(home)
        local_url, local_key = read_local(folder)
        if url is None and local_url is not None:
            url, source = local_url, str(folder / "embedded.json")
            key = key or local_key
    if url is None:
        raise ConfigError(
            f"no API URL: pass --url / base_url, set {URL_ENV}, or start a local stack (stare local up)",
            param=URL_ENV,
        )
    if key is None:
        raise ConfigError(f"no API key: pass --api-key / api_key or set {KEY_ENV}", param=KEY_ENV)
    return Connection(check_url(url), key, source)
