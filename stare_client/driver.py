"""One definition of each client operation, run by either of two thin drivers: blocking (httpx.Client) or
asyncio (httpx.AsyncClient).

An operation is a generator that does no I/O itself: it yields an effect (send this request, sleep, read
this streamed body, run this blocking step) and is sent the effect's result, or has the effect's exception
thrown into it, so its retry loops, paging, reconnects and download checks are written once. An operation
that lists yields `Item(value)` for each value it produces. SyncDriver performs effects by calling;
AsyncDriver by awaiting. Both close any streamed response an operation leaves open when it ends or is
abandoned (a caller that stops iterating).

The public methods are the operations themselves, wrapped by two descriptors: `operation` (a value) and
`listing` (an iterator). On a resource of a sync client `client.jobs.get(job)` returns the job; on an async
one it returns a coroutine, and `listing`s return an async iterator. One signature and docstring serve both,
and type checkers see both (the descriptors' overloads on the resource's mode). Inside an operation another
one is reached as `self.get.op(...)` (its generator, to `yield from`).

This stands where the OpenAI SDK generates a sync and an async twin of every resource: here the twin is
derived at run time from the one source, so there is nothing to keep in step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Concatenate, Generic, ParamSpec, TypeVar, cast, overload

import httpx

from stare_client import transport

P = ParamSpec("P")
R = TypeVar("R")


class Sync:
    """The mode of a blocking client's resources."""


class Async:
    """The mode of an asyncio client's resources."""


M = TypeVar("M", Sync, Async)

# ------------------------------------------------------------------------------------------------- effects


@dataclass(frozen=True)
class Send:
    """Send a request; the result is the response (its body read unless `stream`)."""

    request: httpx.Request
    stream: bool = False


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class ReadBody:
    """Read a streamed response's whole body (an error's), then close it."""

    response: httpx.Response


@dataclass(frozen=True)
class Close:
    response: httpx.Response


@dataclass(frozen=True)
class Lines:
    """The result is a handle for NextLine over a streamed response's text lines, none longer than
    `max_line_bytes` (transport.LineSplitter: a longer one raises, however long the server keeps it going)."""

    response: httpx.Response
    max_line_bytes: int = transport.MAX_EVENT_LINE_BYTES
    chunk_bytes: int | None = None  # as they arrive (a network read is at most 64 KiB)


@dataclass(frozen=True)
class NextLine:
    """The next line of a Lines handle, or None at the end of the body."""

    lines: Any


@dataclass(frozen=True)
class Pump:
    """Feed a streamed response's body to `sink` in chunks, then close the response (also when `sink` or the
    connection raises)."""

    response: httpx.Response
    sink: Callable[[bytes], None]
    chunk_bytes: int = 1024 * 1024


@dataclass(frozen=True)
class Blocking:
    """Run a blocking step (unpacking, merging): called in place, or in a worker thread by AsyncDriver."""

    fn: Callable[[], Any]


@dataclass(frozen=True)
class Item(Generic[R]):
    """A value a listing operation produces."""

    value: R


Effect = Send | Sleep | ReadBody | Close | Lines | NextLine | Pump | Blocking
Op = Generator[Effect, Any, R]
"""An operation that returns R."""
ListingOp = Generator[Effect | Item[R], Any, None]
"""An operation that produces R values."""


@dataclass
class Done:
    value: Any


@dataclass
class Stepper:
    """Advances one operation: sends it the last effect's result or throws the last effect's error, and keeps
    the streamed responses it opened (for the driver to close when it ends)."""

    op: Generator[Any, Any, Any]
    result: Any = None
    error: BaseException | None = None
    opened: list[httpx.Response] = field(default_factory=list)

    def next(self) -> Effect | Item[Any] | Done:
        try:
            if self.error is not None:
                error, self.error = self.error, None
                return cast(Effect | Item[Any], self.op.throw(error))
            return cast(Effect | Item[Any], self.op.send(self.result))
        except StopIteration as done:
            return Done(done.value)
        finally:
            self.result = None


# ------------------------------------------------------------------------------------------------- drivers


class SyncDriver:
    """Every body it reads whole is bounded by `max_response_bytes` (transport.MAX_RESPONSE_BYTES): the
    request is streamed and read chunk by chunk, never by httpx's unbounded read."""

    def __init__(self, http: httpx.Client, max_response_bytes: int = transport.MAX_RESPONSE_BYTES) -> None:
        self.http = http
        self.max_response_bytes = max_response_bytes

    def _read(self, response: httpx.Response) -> None:
        try:
            transport.keep_bounded(response, response.iter_raw(), self.max_response_bytes)
        finally:
            response.close()

    def perform(self, effect: Effect, step: Stepper) -> Any:
        if isinstance(effect, Send):
            response = self.http.send(effect.request, stream=True)
            if effect.stream:
                step.opened.append(response)
            else:
                self._read(response)
            return response
        if isinstance(effect, Sleep):
            time.sleep(effect.seconds)
        elif isinstance(effect, ReadBody | Close):
            if isinstance(effect, ReadBody):
                self._read(effect.response)
            effect.response.close()
        elif isinstance(effect, Lines):
            return transport.bounded_lines(
                effect.response.iter_bytes(effect.chunk_bytes), effect.max_line_bytes
            )
        elif isinstance(effect, NextLine):
            return next(effect.lines, None)
        elif isinstance(effect, Pump):
            try:
                for chunk in effect.response.iter_bytes(effect.chunk_bytes):
                    effect.sink(chunk)
            finally:
                effect.response.close()
        elif isinstance(effect, Blocking):
            return effect.fn()
        return None

    def drive(self, op: Generator[Any, Any, Any]) -> Generator[Item[Any] | Done, None, None]:
        step = Stepper(op)
        try:
            while not isinstance(effect := step.next(), Done):
                if isinstance(effect, Item):
                    yield effect
                    continue
                try:
                    step.result = self.perform(effect, step)
                except Exception as err:  # the operation decides: retry, translate or propagate
                    step.error = err
            yield effect
        finally:
            op.close()
            for response in step.opened:
                response.close()

    def run(self, op: Op[R]) -> R:
        with contextlib.closing(self.drive(op)) as outs:
            for out in outs:
                if isinstance(out, Done):
                    return cast(R, out.value)
        raise AssertionError("unreachable: drive ends with Done")

    def iterate(self, op: ListingOp[R]) -> Generator[R, None, None]:
        with contextlib.closing(self.drive(op)) as outs:
            for out in outs:
                if isinstance(out, Item):
                    yield out.value


class AsyncDriver:
    """SyncDriver's bound on every body it reads whole, for the async client."""

    def __init__(
        self, http: httpx.AsyncClient, max_response_bytes: int = transport.MAX_RESPONSE_BYTES
    ) -> None:
        self.http = http
        self.max_response_bytes = max_response_bytes

    async def _read(self, response: httpx.Response) -> None:
        try:
            await transport.akeep_bounded(response, response.aiter_raw(), self.max_response_bytes)
        finally:
            await response.aclose()

    async def perform(self, effect: Effect, step: Stepper) -> Any:
        if isinstance(effect, Send):
            response = await self.http.send(effect.request, stream=True)
            if effect.stream:
                step.opened.append(response)
            else:
                await self._read(response)
            return response
        if isinstance(effect, Sleep):
            await asyncio.sleep(effect.seconds)
        elif isinstance(effect, ReadBody | Close):
            if isinstance(effect, ReadBody):
                await self._read(effect.response)
            await effect.response.aclose()
        elif isinstance(effect, Lines):
            return transport.abounded_lines(
                effect.response.aiter_bytes(effect.chunk_bytes), effect.max_line_bytes
            )
        elif isinstance(effect, NextLine):
            return await anext(effect.lines, None)
        elif isinstance(effect, Pump):
            try:
                async for chunk in effect.response.aiter_bytes(effect.chunk_bytes):
                    effect.sink(chunk)
            finally:
                await effect.response.aclose()
        elif isinstance(effect, Blocking):
            return await _in_thread(effect.fn)
        return None

    async def drive(self, op: Generator[Any, Any, Any]) -> AsyncGenerator[Item[Any] | Done, None]:
        step = Stepper(op)
        try:
            while not isinstance(effect := step.next(), Done):
                if isinstance(effect, Item):
                    yield effect
                    continue
                try:
                    step.result = await self.perform(effect, step)
                except Exception as err:  # the operation decides: retry, translate or propagate
                    step.error = err
            yield effect
        finally:
            op.close()
            for response in step.opened:
                await response.aclose()

    async def run(self, op: Op[R]) -> R:
        async with contextlib.aclosing(self.drive(op)) as outs:
            async for out in outs:
                if isinstance(out, Done):
                    return cast(R, out.value)
        raise AssertionError("unreachable: drive ends with Done")

    async def iterate(self, op: ListingOp[R]) -> AsyncGenerator[R, None]:
        async with contextlib.aclosing(self.drive(op)) as outs:
            async for out in outs:
                if isinstance(out, Item):
                    yield out.value


async def _in_thread(fn: Callable[[], Any]) -> Any:
    """`fn()` in a worker thread. When the caller is cancelled meanwhile, the thread (which cannot be
    stopped) is waited for before the cancellation goes on, so the operation's cleanup (removing a partial
    folder) never races a thread still writing into it."""
    task = asyncio.ensure_future(asyncio.to_thread(fn))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise


# ---------------------------------------------------------------------------------------------- the twins


class Bindable(Generic[M]):
    """A client or one of its resources: what an operation's descriptor binds to. `_driver` runs it."""

    _driver: SyncDriver | AsyncDriver


class Bound(Generic[P, R]):
    """An operation bound to its resource: `.op(...)` is its generator (for other operations)."""

    def __init__(self, fn: Callable[..., Any], owner: Bindable[Any]) -> None:
        self._fn = fn
        self._owner = owner
        functools.update_wrapper(cast(Any, self), fn)

    def op(self, *args: P.args, **kwargs: P.kwargs) -> Op[R]:
        return cast(Op[R], self._fn(self._owner, *args, **kwargs))

    def listing(self, *args: P.args, **kwargs: P.kwargs) -> ListingOp[R]:
        return cast(ListingOp[R], self._fn(self._owner, *args, **kwargs))

    def __repr__(self) -> str:
        return f"<operation {self._fn.__qualname__} of {self._owner!r}>"


class SyncCall(Bound[P, R]):
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return cast(SyncDriver, self._owner._driver).run(self.op(*args, **kwargs))


class AsyncCall(Bound[P, R]):
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        return cast(AsyncDriver, self._owner._driver).run(self.op(*args, **kwargs))


class SyncListing(Bound[P, R]):
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Generator[R, None, None]:
        return cast(SyncDriver, self._owner._driver).iterate(self.listing(*args, **kwargs))


class AsyncListing(Bound[P, R]):
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> AsyncGenerator[R, None]:
        return cast(AsyncDriver, self._owner._driver).iterate(self.listing(*args, **kwargs))


class Twin(Generic[P, R]):
    """A descriptor that binds its function to a sync or an async kind of Bound, by the owner's driver."""

    sync_kind: ClassVar[type[Bound[Any, Any]]]
    async_kind: ClassVar[type[Bound[Any, Any]]]

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        functools.update_wrapper(cast(Any, self), fn)

    def bind(self, owner: Bindable[Any] | None) -> Any:
        if owner is None:
            return self
        kind = self.sync_kind if isinstance(owner._driver, SyncDriver) else self.async_kind
        return kind(self.fn, owner)


class operation(Twin[P, R]):
    """A method that returns a value: the value on a sync client, a coroutine on an async one."""

    sync_kind, async_kind = SyncCall, AsyncCall

    def __init__(self, fn: Callable[Concatenate[Any, P], Op[R]]) -> None:
        super().__init__(fn)

    @overload
    def __get__(self, owner: None, cls: type) -> operation[P, R]: ...
    @overload
    def __get__(self, owner: Bindable[Sync], cls: type) -> SyncCall[P, R]: ...
    @overload
    def __get__(self, owner: Bindable[Async], cls: type) -> AsyncCall[P, R]: ...
    def __get__(self, owner: Bindable[Any] | None, cls: type) -> Any:
        return self.bind(owner)


class listing(Twin[P, R]):
    """A method that produces values: an iterator on a sync client, an async iterator on an async one."""

    sync_kind, async_kind = SyncListing, AsyncListing

    def __init__(self, fn: Callable[Concatenate[Any, P], ListingOp[R]]) -> None:
        super().__init__(fn)

    @overload
    def __get__(self, owner: None, cls: type) -> listing[P, R]: ...
    @overload
    def __get__(self, owner: Bindable[Sync], cls: type) -> SyncListing[P, R]: ...
    @overload
    def __get__(self, owner: Bindable[Async], cls: type) -> AsyncListing[P, R]: ...
    def __get__(self, owner: Bindable[Any] | None, cls: type) -> Any:
        return self.bind(owner)
