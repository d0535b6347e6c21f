"""Finite-or-None: the one reading of "a number we can store, show or export" shared by every layer."""

from __future__ import annotations

import math


def finite(value: object) -> float | None:
    """`value` as a float when it is a finite int or float, else None. Booleans are not numbers here, and
    an int too large for a float is not finite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
