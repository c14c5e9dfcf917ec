"""asyncio's conventions for resources, written once for every layer.

:class:`Closable` is the closing protocol: ``close()`` (synchronous,
idempotent) ``-> wait_closed()``; ``aclose()`` and ``async with`` do both;
an object collected open warns with ``ResourceWarning``.
:class:`CloseWaiters` serves ``wait_closed()`` for objects that may be
closed outside any event loop. :func:`check_loop` refuses a call from
another loop than the one a resource is bound to (compiled, in
:mod:`aiordma._loop_check`), :func:`check_thread` a ``close()`` from
another thread than the one running that loop, and :func:`spawn` runs a
task nobody awaits, kept referenced until it ends. This module imports nothing of the package
but that check and its errors, so every layer can build on it.
"""

from __future__ import annotations

import asyncio
import inspect
import warnings
from collections.abc import Coroutine
from typing import Any, Self

from aiordma._loop_check import check_loop
from aiordma.exceptions import WrongLoopError

__all__ = [
    "Closable",
    "CloseWaiters",
    "check_loop",
    "check_thread",
    "consume_outcome",
    "is_async_callable",
    "spawn",
]


class Closable:
    """asyncio's closing protocol, written once.

    ``close()`` starts closing (synchronous, idempotent; some return an
    awaitable for it); ``wait_closed()`` waits until everything is
    released; :meth:`aclose` does both (graceful where a subclass says
    how); ``async with`` calls :meth:`aclose` on the way out. An object
    collected while ``_unclosed()`` says it still holds resources warns
    with ``ResourceWarning``, as an unclosed socket does.
    """

    __slots__ = ()

    def close(self) -> object:
        raise NotImplementedError

    def is_closing(self) -> bool:
        raise NotImplementedError

    async def wait_closed(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close, and wait until everything is released."""
        self.close()
        await self.wait_closed()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _unclosed(self) -> bool:
        """Whether the object still holds what closing releases (called at
        collection, possibly on an object whose ``__init__`` failed)."""
        return False

    def __del__(self, _warn: Any = warnings.warn) -> None:
        try:
            unclosed = self._unclosed()
        except AttributeError:  # made only in part
            return
        if unclosed:
            _warn(f"unclosed {self!r}", ResourceWarning, source=self)


class CloseWaiters:
    """Futures of tasks waiting for one resource to close, for ``wait_closed()``
    of resources whose ``close()`` is synchronous (devices, memory regions):
    such objects may be created and closed outside any event loop, so each
    call parks a future of its caller's loop here, and closing resolves them all."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    async def wait(self) -> None:
        """Wait until :meth:`closed` is called."""
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)

    def closed(self) -> None:
        """The resource is closed: wake every waiter (on its own loop)."""
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            loop = fut.get_loop()
            if not fut.done() and not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, fut)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def check_thread(loop: asyncio.AbstractEventLoop | None, what: str) -> None:
    """WrongLoopError if ``loop`` is running in another thread than the caller's.

    asyncio's loops are not thread-safe, so every ``close()`` of an object
    bound to a loop makes this check before it changes any state. Closing
    while that loop is not running (after its ``asyncio.run()`` returned,
    say) stays allowed: nothing else can touch the object then.
    """
    if loop is None or not loop.is_running():
        return
    try:
        check_loop(loop)
    except WrongLoopError:
        raise WrongLoopError(
            f"{what} was called from another thread than the one running its event "
            "loop (asyncio's loops are not thread-safe): call it there, for instance "
            "with loop.call_soon_threadsafe()"
        ) from None


_background: set[asyncio.Task[Any]] = set()


def spawn(coro: Coroutine[Any, Any, Any]) -> None:
    """Run ``coro`` on the running loop as a task of its own."""
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


def consume_outcome(fut: asyncio.Future[Any]) -> None:
    """A done-callback for work nobody awaits: its failure is no news."""
    if not fut.cancelled():
        fut.exception()


def is_async_callable(obj: object) -> bool:
    """Whether calling ``obj`` gives a coroutine: an ``async def`` function, a
    ``functools.partial`` of one, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(obj) or inspect.iscoroutinefunction(
        getattr(obj, "__call__", None)  # noqa: B004  (the method itself, not callable())
    )
