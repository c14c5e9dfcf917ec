"""``wait_closed()`` for resources whose ``close()`` is synchronous (devices, memory regions).

Such objects may be created and closed outside any event loop, so they hold
no future of their own: each ``wait_closed()`` call parks a future of its
caller's loop here, and closing resolves them all.
"""

from __future__ import annotations

import asyncio


class CloseWaiters:
    """Futures of tasks waiting for one resource to close."""

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
