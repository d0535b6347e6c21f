"""Sign-in sessions of the job page: a signed, stateless cookie instead of the API key.

The browser presents its API key once, in the body of POST /ui/session; the server checks it like a Bearer
key and answers with a cookie that holds no secret of the tenant's: the key's id, the tenant's id, an expiry
and a random nonce, signed with HMAC-SHA256 under the server's session secret. The cookie authenticates the
page's requests to /v1 as the key itself would (service.dependencies.authenticate: the same principal cache,
last-used record, rate bucket and ownership checks), so revoking the key ends its sessions as it ends the key.

The cookie is HttpOnly (scripts cannot read it), SameSite=Strict (no request started by another site's page
carries it, not even a top-level navigation), Secure when the page is served over https, and scoped to
Path=/: the page's scripts call /v1 themselves, so the cookie must reach /v1 as well as /ui. Every
cookie-authenticated request with an unsafe method (anything but GET, HEAD, OPTIONS) must also carry the
header `X-CSRF-Token`, a token derived from the cookie's nonce that only the server's own pages embed; a
Bearer request never needs it (another site cannot make a browser send an Authorization header). Signing out
clears the cookie; a copy taken before stays valid until its expiry (Settings.session_ttl_s).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass

COOKIE_NAME = "stare_session"
COOKIE_PATH = "/"
CSRF_HEADER = "X-CSRF-Token"
SIGN_IN_HEADER = "X-Stare-Sign-In"  # the sign-in POST needs it: a cross-site form cannot send a custom header
MAX_COOKIE_CHARS = 512
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # no CSRF token needed: they change nothing
_ID = re.compile(r"[a-z]{1,8}_[A-Za-z0-9]{1,56}")  # key and tenant ids (store.ids)
MAX_EXPIRES = 2**40  # unix seconds; far past any Settings.session_ttl_s


@dataclass(frozen=True)
class Session:
    key_id: str
    tenant_id: str
    expires: int  # unix seconds
    nonce: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionSigner:
    """Issues and verifies session cookies and their CSRF tokens with one secret."""

    def __init__(self, secret: bytes | None, ttl_s: float) -> None:
        self._secret = secret if secret else secrets.token_bytes(32)
        self.ttl_s = ttl_s

    def _mac(self, purpose: str, payload: str) -> bytes:
        return hmac.new(self._secret, f"{purpose}\n{payload}".encode(), hashlib.sha256).digest()

    def issue(self, key_id: str, tenant_id: str, now: float | None = None) -> tuple[str, Session]:
        now = time.time() if now is None else now
        session = Session(key_id, tenant_id, int(now + self.ttl_s), secrets.token_urlsafe(16))
        body = json.dumps(
            {"k": session.key_id, "t": session.tenant_id, "e": session.expires, "n": session.nonce},
            separators=(",", ":"),
        )
        payload = _b64(body.encode())
        return f"{payload}.{_b64(self._mac('session', payload))}", session

    def verify(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session a cookie stands for, or None when it is missing, malformed, forged or expired."""
        if not cookie or len(cookie) > MAX_COOKIE_CHARS or cookie.count(".") != 1:
            return None
        payload, signature = cookie.split(".")
        try:
            given = _unb64(signature)
            fields = json.loads(_unb64(payload))
        except (binascii.Error, ValueError, UnicodeDecodeError):
            return None
        if not hmac.compare_digest(given, self._mac("session", payload)):
            return None
        if not isinstance(fields, dict):
            return None
        key_id, tenant_id, expires, nonce = (fields.get(name) for name in ("k", "t", "e", "n"))
        if not (isinstance(key_id, str) and isinstance(tenant_id, str) and isinstance(nonce, str)):
            return None
        # Only this server signs cookies; the shapes are checked all the same, so that a leaked secret
        # cannot smuggle a value the database would refuse into the key lookup.
        if not (_ID.fullmatch(key_id) and _ID.fullmatch(tenant_id)):
            return None
        current_s = time.time() if now is None else now
        if type(expires) is not int or not current_s < expires < MAX_EXPIRES:
            return None
        return Session(key_id, tenant_id, expires, nonce)

    def csrf_token(self, session: Session) -> str:
        return _b64(self._mac("csrf", session.nonce))

    def csrf_ok(self, session: Session, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(
            presented.encode(), self.csrf_token(session).encode()
        )
