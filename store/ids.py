"""Object ids: a type prefix and 26 Crockford base-32 characters (48-bit milliseconds, 80 random bits).

Ids sort by creation time, so "newest first" and cursor pagination are an index scan on the id alone.
"""

from __future__ import annotations

import re
import secrets
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ID_BODY = r"[0-9A-HJKMNP-TV-Z]{26}"


def new_id(prefix: str) -> str:
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"


def id_pattern(prefix: str) -> str:
    return f"^{prefix}_{ID_BODY}$"


def is_id(prefix: str, value: str) -> bool:
    return re.fullmatch(id_pattern(prefix), value) is not None
