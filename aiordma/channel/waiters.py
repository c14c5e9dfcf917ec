# cython: annotation_typing=True
"""The tasks waiting on one side of a message channel, and waking them.

A task waits with :meth:`Waiters.changed` for any change (credits, send
slots, arrivals, the channel's state), or with :meth:`Waiters.arrivals`
for the next message or piece: a message the delivery hook takes wakes
only the former, so a hook that takes every small message costs a
receiving task no wake-up. :class:`~aiordma.channel.packets.Packets` wakes
them from the completion drain, in C and in the same call that saw the
change, which is what makes a message's wake-up cheap (decision records
0006 and 0010: a round trip wakes each side once).

Call order: ``(changed | arrivals)* -> wake`` (any number of times).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiordma import _cython_shim as cython
else:
    try:
        import cython
    except ImportError:  # no Cython: the declarations below mean nothing
        from aiordma import _cython_shim as cython


@cython.cclass
class Waiters:
    """Futures of the tasks waiting on ``loop`` (the callers checked the loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.changes: list[asyncio.Future[None]] = []
        """Tasks waiting for any change (:meth:`changed`)."""
        self.receiving: list[asyncio.Future[None]] = []
        """Tasks waiting for a message or a piece to arrive (:meth:`arrivals`)."""

    @cython.ccall
    def changed(self) -> asyncio.Future[None]:
        """A future that resolves at the next :meth:`wake`."""
        fut: asyncio.Future[None] = self._loop.create_future()
        self.changes.append(fut)
        return fut

    @cython.ccall
    def arrivals(self) -> asyncio.Future[None]:
        """A future that resolves at the next :meth:`wake` with ``receiving``."""
        fut: asyncio.Future[None] = self._loop.create_future()
        self.receiving.append(fut)
        return fut

    @cython.ccall
    def wake(self, receiving: cython.bint) -> None:
        """Wake the tasks waiting in :meth:`changed` (and in :meth:`arrivals`
        if ``receiving``)."""
        waiters = self.changes
        if receiving and self.receiving:
            waiters = waiters + self.receiving
            self.receiving = []
        elif not waiters:
            return
        self.changes = []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
