"""A Python audit hook that records every compile/exec of text holding a marker, while armed.

`eval(s)`, `exec(s)`, `compile(s, ...)` and sympy's `parse_expr` (which compiles a rewritten copy of its
input) all raise the `compile` audit event with the source before anything runs, so a marker seen there
means some path handed that text to an evaluator, whether or not the code then succeeded. The hook is
installed once per process (audit hooks cannot be removed) and records nothing unless armed.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

_armed: list[str] = []
_seen: list[str] = []


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _armed or event not in ("compile", "exec"):
        return
    source = args[0] if args else None
    if isinstance(source, bytes):
        source = source.decode("utf-8", "replace")
    if isinstance(source, str) and any(marker in source for marker in _armed):
        _seen.append(source[:200])
    elif hasattr(source, "co_consts") and any(marker in str(source.co_consts) for marker in _armed):
        _seen.append(f"code object {source.co_name}")


sys.addaudithook(_hook)


@contextlib.contextmanager
def watching(marker: str) -> Iterator[list[str]]:
    """The sources holding `marker` that were compiled or executed inside the block."""
    _seen.clear()
    _armed.append(marker)
    seen: list[str] = []
    try:
        yield seen
    finally:
        _armed.remove(marker)
        seen.extend(_seen)
        _seen.clear()
