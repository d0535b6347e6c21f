"""API keys: `sk-stare-<12 char lookup id><32 char secret>`, stored as SHA-256, compared in constant time.

The first KEY_PREFIX_LENGTH characters (the visible prefix) find the row; the SHA-256 of the whole key is
then compared with hmac.compare_digest. Keys carry 256 bits of randomness, so a fast hash is the right tool
(no password stretching needed); the database never holds a usable key.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string

KEY_SCHEME = "sk-stare-"
_ALPHABET = string.ascii_letters + string.digits
_ALPHABET_SET = frozenset(_ALPHABET)
_LOOKUP_CHARS = 12
_SECRET_CHARS = 43  # 62^43 > 2^256
KEY_PREFIX_LENGTH = len(KEY_SCHEME) + _LOOKUP_CHARS
KEY_LENGTH = KEY_PREFIX_LENGTH + _SECRET_CHARS


def generate_key() -> str:
    return KEY_SCHEME + "".join(secrets.choice(_ALPHABET) for _ in range(_LOOKUP_CHARS + _SECRET_CHARS))


def key_prefix(key: str) -> str:
    return key[:KEY_PREFIX_LENGTH]


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_matches(key: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_key(key).encode("ascii"), stored_hash.encode("ascii"))


def looks_like_key(key: str) -> bool:
    return (
        len(key) == KEY_LENGTH
        and key.startswith(KEY_SCHEME)
        and all(c in _ALPHABET_SET for c in key[len(KEY_SCHEME) :])
    )
