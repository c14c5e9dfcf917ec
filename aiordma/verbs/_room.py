# cython: annotation_typing=True
"""Room in a work queue, counted first come first served (send queue, receive queue).

Posting more work requests than a queue holds fails with ENOMEM; instead
callers wait here, in order, until completions give entries back.
Cancelling a waiter never loses or leaks an entry. ("Slots" elsewhere are
the fixed buffers a channel's packets go through; this module counts only
the queues' room.)

Every packet a message channel sends takes and gives back a send-queue
entry, so the count is an extension type when compiled (``_room.pxd``;
see :mod:`aiordma._compiled`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from types import TracebackType
from typing import TYPE_CHECKING

from aiordma.exceptions import again

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython


@cython.cclass
class QueueRoom:
    """``size`` entries of room; :meth:`acquire` waits (FIFO) until enough are free."""

    def __init__(self, size: int) -> None:
        if size <= 0:
            raise ValueError(f"a queue's room is at least one entry, not {size}")
        self.size = size
        self.free = size
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._failure: BaseException | None = None
        self._failure_tb: TracebackType | None = None

    @cython.ccall
    def try_acquire(self, n: cython.int) -> cython.bint:
        """Take ``n`` entries if they are free now and nobody is queued ahead."""
        if self._failure is not None:
            raise again(self._failure, self._failure_tb)  # not grown by each raise
        if not self._waiters and self.free >= n:
            self.free -= n
            return True
        return False

    @cython.ccall
    def can_acquire(self, n: cython.int) -> cython.bint:
        """Whether :meth:`try_acquire` would take ``n`` entries now (failed
        room says yes: the taking then raises its failure)."""
        return self._failure is not None or (not self._waiters and self.free >= n)

    async def acquire(self, n: int = 1) -> None:
        """Take ``n`` entries, waiting behind earlier callers until they are free."""
        if not 0 < n <= self.size:
            raise ValueError(f"cannot take {n} of {self.size} entries at once")
        if self.try_acquire(n):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        self._waiters.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(n)  # granted just before the cancellation landed
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
                self._wake()  # a big request leaving may unblock smaller ones behind it
            raise

    @cython.ccall
    def release(self, n: cython.int = 1) -> None:
        self.free += n
        self._wake()

    @cython.cfunc
    def _wake(self) -> None:
        while self._waiters and self.free >= self._waiters[0][0]:
            n, fut = self._waiters.popleft()
            if fut.done():
                continue
            self.free -= n
            fut.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """Fail every waiter and every later acquire with ``exc``."""
        self._failure, self._failure_tb = exc, exc.__traceback__
        while self._waiters:
            _, fut = self._waiters.popleft()
            if not fut.done():
                fut.set_exception(again(exc, exc.__traceback__))  # each its own: see again()
