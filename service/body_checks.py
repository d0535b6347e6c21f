"""JSON body checks out of the API process (issue 44, R3): the request boundary checks a large body
(contract.safejson) in one of a few spawned processes, so neither the check's time nor its hold on the
interpreter lock reaches the event loop.

safejson's check is linear and mostly in C, and C holds the interpreter lock for all of a call: in a worker
thread it still kept the event loop waiting (a regular expression over 1 MiB is one call), and a probe of
GET /healthz waited behind it. Here the loop only hands the bytes to a pipe and awaits a small answer. A
body smaller than INLINE_BYTES is checked in place (microseconds). If the processes cannot be used (one
died, the machine refuses to start them) the check runs in a worker thread instead, logged: slower for the
loop, never unchecked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
from concurrent.futures.process import BrokenProcessPool

import anyio.to_thread

from contract import safejson

logger = logging.getLogger(__name__)

INLINE_BYTES = 64 * 1024


def check(body: bytes, max_values: int) -> safejson.Problem | None:
    """The first problem of a JSON body, None when it has none or is not JSON at all (the route's own
    parsing answers that)."""
    try:
        safejson.loads(body, max_values=max_values)
    except safejson.UnsafeDocument as err:
        return err.problem
    except ValueError:
        return None
    return None


PR_SET_PDEATHSIG = 1


def _end_with_the_api() -> None:
    """In each checking process: SIGKILL when the API process that started it ends, however it ends (a
    SIGKILL or a hung shutdown included); a pool child otherwise waits on its queue forever."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the API ended before the line above ran
        os._exit(0)


class BodyChecks:
    def __init__(self, *, processes: int, max_values: int) -> None:
        self.processes, self.max_values = processes, max_values
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # Started from the event loop's thread (the first large body), which lives as long as the
                # API: the death signal follows the thread that forked.
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    self.processes,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_end_with_the_api,
                )
            return self._pool

    async def check(self, body: bytes) -> safejson.Problem | None:
        if len(body) <= INLINE_BYTES or self.processes <= 0:
            return check(body, self.max_values)
        try:
            future = self._executor().submit(check, body, self.max_values)
            return await asyncio.wrap_future(future)
        except (BrokenProcessPool, OSError, RuntimeError) as err:
            logger.warning("body checks in a thread: the checking processes failed (%s)", err)
            self._reset()
            return await anyio.to_thread.run_sync(check, body, self.max_values)

    def _reset(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._reset()
