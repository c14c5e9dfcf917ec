"""One transfer on one channel: its pairs posted and awaited to the end.

A single block of at most one piece goes as one RDMA write or read
(:func:`~aiordma.channel.post_block`: no table, no bulk run); anything
else becomes a table of :mod:`aiordma.bulk_table` records
(:mod:`aiordma.transfer._plan`) that the verbs layer posts in bounded
chunks from the completion drain (:func:`~aiordma.channel.start_bulk`).
Either way the awaiting task returns only once the device is done with the
buffers, even when it is cancelled or its deadline passes.

Call order: ``block | table -> post -> done (settled, even if cancelled)``;
a failure counts in ``failures:read|write``, closes the channel (its queue
pair is in the error state: the next use reconnects) and raises
:class:`~aiordma.TransferError` naming the first block that failed.
"""

from __future__ import annotations

import asyncio
from array import array
from typing import Any

from aiordma import bulk_table
from aiordma.channel import (
    MemoryRegion,
    MessageChannel,
    post_block,
    read_piece_for,
    start_bulk,
)
from aiordma.exceptions import ResourceClosedError, TransferError
from aiordma.metrics import Stats
from aiordma.transfer import _plan
from aiordma.transfer.descriptors import DescriptorList


async def run(
    channel: MessageChannel, write: bool, local: DescriptorList, remote: DescriptorList,
    mrs: tuple[MemoryRegion, ...], piece: int | None, window: int | None,
    deadline: float | None, stats: Stats,
) -> None:  # fmt: skip
    """Move ``local``'s blocks to (``write``) or from ``remote``'s, pair by
    pair, on ``channel`` (checked lists; ``mrs`` are ``local``'s regions'
    memory, ``piece`` and ``window`` the agent's, None: the path's)."""
    piece = read_piece_for(piece, channel.loopback)
    block = None
    if deadline is None and len(local) == 1 and local.lengths[0] <= piece:
        rkey = remote.regions[remote.region_of[0]].rkey
        block = post_block(channel, write, mrs[local.region_of[0]], local.addrs[0],
                           local.lengths[0], remote.addrs[0], rkey)  # fmt: skip
    if block is not None:  # None: the queue pair cannot take it now; the bulk run waits
        await _block_done(channel, write, block, stats)
    else:
        records, count = table(local, remote, piece)
        await _bulk(channel, write, records, count, mrs, window, deadline, stats)


def table(local: DescriptorList, remote: DescriptorList, piece: int) -> tuple[array[int], int]:
    """The pairs as records of ``piece`` bytes at most (joined where they
    continue), and how many records were made."""
    count = len(local)
    records = bulk_table.new_table(_plan.records_needed(local.lengths, count, piece))
    lkeys = array("I", [r.lkey for r in local.regions])
    rkeys = array("I", [r.rkey for r in remote.regions])
    n = _plan.fill(local.addrs, local.lengths, local.region_of, lkeys,
                   remote.addrs, remote.region_of, rkeys, count, piece, records)  # fmt: skip
    return records, n


async def _block_done(
    channel: MessageChannel, write: bool, block: asyncio.Future[Any], stats: Stats
) -> None:
    """Wait for a single block's completion (even if cancelled); its failure
    as the bulk run reports one."""
    what = "write" if write else "read"
    try:
        await asyncio.shield(block)
    except asyncio.CancelledError:
        await _settled(block)
        raise
    except Exception as error:
        stats.add(f"failures:{what}")
        channel.close()
        raise TransferError(f"{what} failed at descriptor 0: {error}", 0) from error


async def _bulk(
    channel: MessageChannel, write: bool, records: array[int], count: int,
    mrs: tuple[MemoryRegion, ...], window: int | None, deadline: float | None, stats: Stats,
) -> None:  # fmt: skip
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    what = "write" if write else "read"

    def finished(error: BaseException | None, tag: int) -> None:
        if done.done():
            return
        if error is None:
            done.set_result(None)
            return
        index = None if tag < 0 else tag
        where = "before its first block" if index is None else f"at descriptor {index}"
        exc = TransferError(f"{what} failed {where}: {error}", index)
        exc.__cause__ = error
        done.set_exception(exc)

    try:
        bulk = start_bulk(channel, write, records, count, mrs, finished, window=window)
    except (ResourceClosedError, ConnectionError) as exc:
        raise TransferError(f"{what} failed before its first block: {exc}") from exc
    try:
        async with asyncio.timeout_at(deadline):
            await asyncio.shield(done)
    except TransferError:
        stats.add(f"failures:{what}")
        channel.close()
        raise
    except BaseException:
        bulk.cancel()
        await _settled(done)
        raise


async def _settled(done: asyncio.Future[Any]) -> None:
    """Wait for ``done`` however often the caller is cancelled meanwhile (the
    device is still using the buffers); then let the cancellation go on."""
    cancelled = False
    while not done.done():
        try:
            await asyncio.wait([done])
        except asyncio.CancelledError:
            cancelled = True
    if not done.cancelled():
        done.exception()  # seen: the caller's own error (cancel, timeout) wins
    if cancelled:
        raise asyncio.CancelledError
