"""One-sided bulk work on a channel's queue pair: the door for engines above.

The transfer agents move descriptor lists by RDMA READ and WRITE on the
queue pair of a channel they hold. These two functions are their way in,
so nothing above the channel layer reaches the queue pair itself: a table
of :mod:`aiordma.bulk_table` records started as a running transfer, or a
single block posted at once. How many records run at once is chosen by
the path (:mod:`aiordma.channel.sizing`) unless the caller says.

Call order: ``post_block`` -> its future; or ``start_bulk -> [cancel] ->
done(error, tag)`` exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from aiordma.channel.channel import MessageChannel
from aiordma.channel.sizing import bulk_window_for
from aiordma.verbs.memory import MemoryRegion

BulkDone = Callable[[BaseException | None, int], None]
"""``done(error, tag)``: every posted record settled; ``error`` is None or
the first failure, ``tag`` the failed record's (-1: none)."""


class RunningBulk(Protocol):
    """A table being moved: ``cancel()`` stops posting (``done`` still
    comes once what was posted has completed)."""

    def cancel(self) -> None: ...


def start_bulk(
    channel: MessageChannel, write: bool, table: Any, count: int,
    mrs: tuple[MemoryRegion, ...], done: BulkDone, *, window: int | None = None,
) -> RunningBulk:  # fmt: skip
    """Start RDMA WRITEs (or READs) of ``count`` records of ``table`` on
    ``channel``'s queue pair, their local memory all in ``mrs`` (checked by
    the caller against the records); ``window`` records in flight (None:
    by the path). ``done`` is called once, from the completion drain.
    Raises :class:`~aiordma.ResourceClosedError` or ``ConnectionError``
    if the channel's queue pair can no longer post."""
    window = bulk_window_for(window, channel.loopback)
    return channel.link.qp.start_bulk(write, table, count, mrs, done, window=window)


def post_block(
    channel: MessageChannel, write: bool, mr: MemoryRegion, addr: int, length: int,
    remote_addr: int, rkey: int,
) -> asyncio.Future[Any] | None:  # fmt: skip
    """One RDMA WRITE (or READ) of ``length`` bytes at ``addr`` inside ``mr``
    to (from) the peer's ``remote_addr`` under ``rkey``, posted now if the
    queue pair has room (its future returned); else None, having done
    nothing (use :func:`start_bulk`)."""
    return channel.link.qp.post_block(write, mr, addr, length, remote_addr, rkey)


__all__ = ["BulkDone", "RunningBulk", "post_block", "start_bulk"]
