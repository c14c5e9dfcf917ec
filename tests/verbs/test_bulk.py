"""Bulk runs: tables of one-sided requests posted in chunks from the drain (lab device)."""

from __future__ import annotations

import asyncio
import random
from array import array

import pytest

import aiordma
from aiordma import Access, RemoteAccessError
from aiordma.bulk_table import LAYOUT, Record
from tests.conftest import Pair

BLOCK = 4096


def table(local: aiordma.MemoryRegion, remote: aiordma.MemoryRegion, pairs: list[tuple[int, int]],
          length: int = BLOCK) -> array[int]:  # fmt: skip
    """Records moving ``length`` bytes from local block ``i`` to remote block ``j``."""
    words = array("Q")
    for tag, (i, j) in enumerate(pairs):
        words.extend(Record(local.addr + i * length, remote.addr + j * length, length,
                            local.lkey, remote.rkey, tag).words())  # fmt: skip
    return words


class Outcome:
    """What ``done`` reported, awaitable."""

    def __init__(self) -> None:
        self.future: asyncio.Future[tuple[BaseException | None, int]] = (
            asyncio.get_running_loop().create_future()
        )
        self.calls = 0

    def done(self, error: BaseException | None, tag: int) -> None:
        self.calls += 1
        self.future.set_result((error, tag))

    async def result(self) -> tuple[BaseException | None, int]:
        async with asyncio.timeout(30):
            return await self.future


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_a_scattered_table_moves_every_block_then_reports_once(
    device: aiordma.Device, pair: Pair
) -> None:
    a, b = pair
    src = device.alloc(BLOCK * 300)
    dst = device.alloc(BLOCK * 300, Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ)
    data = random.Random(1).randbytes(BLOCK * 300)
    src.view()[:] = data
    order = random.Random(2).sample(range(300), 300)
    outcome = Outcome()
    run = a.start_bulk(True, table(src, dst, list(enumerate(order))), 300, (src,),
                       outcome.done, window=32, chunk=8)  # fmt: skip
    assert await outcome.result() == (None, -1)
    assert run.finished
    assert outcome.calls == 1
    view = dst.view()
    for i, j in enumerate(order):
        assert view[j * BLOCK : (j + 1) * BLOCK] == data[i * BLOCK : (i + 1) * BLOCK]
    assert src.inflight == 0
    back = device.alloc(BLOCK * 300)
    outcome = Outcome()
    a.start_bulk(False, table(back, dst, [(j, j) for j in range(300)]), 300, (back,), outcome.done)
    assert await outcome.result() == (None, -1)
    assert back.view()[:] == view[:]
    assert a.stats()["counters"]["ops:bulk_write"] == 1
    assert a.pending == 0
    assert b.pending == 0


@pytest.mark.asyncio
async def test_a_failed_record_names_itself_and_the_rest_is_settled(
    device: aiordma.Device, pair: Pair
) -> None:
    a, _ = pair
    src = device.alloc(BLOCK * 100)
    dst = device.alloc(BLOCK * 100, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    words = table(src, dst, [(i, i) for i in range(100)])
    bad = (dst.rkey ^ 0xFF) | 37 << 32  # a key the peer never gave
    words[37 * LAYOUT.record_words + LAYOUT.rkey_tag] = bad
    outcome = Outcome()
    a.start_bulk(True, words, 100, (src,), outcome.done, window=16, chunk=4)
    error, tag = await outcome.result()
    assert tag == 37
    assert isinstance(error, RemoteAccessError)
    assert src.inflight == 0
    assert a.pending == 0
    with pytest.raises(aiordma.QueuePairError):  # the queue pair is in the error state
        a.start_bulk(True, words, 1, (src,), Outcome().done)


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_cancel_stops_posting_and_reports_once_what_was_posted_is_done(
    device: aiordma.Device, pair: Pair
) -> None:
    a, _ = pair
    src = device.alloc(BLOCK * 1000)
    dst = device.alloc(BLOCK * 1000, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    outcome = Outcome()
    run = a.start_bulk(True, table(src, dst, [(i, i) for i in range(1000)]), 1000, (src,),
                       outcome.done, window=8, chunk=2)  # fmt: skip
    run.cancel()
    assert src.inflight == 1  # held until what was posted completes
    assert await outcome.result() == (None, -1)
    assert run.posted < 1000
    assert src.inflight == 0
    outcome = Outcome()  # the queue pair goes on
    a.start_bulk(True, table(src, dst, [(0, 1)]), 1, (src,), outcome.done)
    assert await outcome.result() == (None, -1)


@pytest.mark.asyncio
async def test_closing_the_queue_pair_ends_a_run_with_its_error(
    device: aiordma.Device, pair: Pair
) -> None:
    a, _ = pair
    src = device.alloc(1 << 20)
    dst = device.alloc(1 << 20, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    outcome = Outcome()
    a.start_bulk(True, table(src, dst, [(i, i) for i in range(256)]), 256, (src,),
                 outcome.done, window=4, chunk=1)  # fmt: skip
    a.close()
    error, _tag = await outcome.result()
    assert isinstance(error, aiordma.ResourceClosedError | aiordma.QueuePairError)
    await a.wait_closed()
    assert src.inflight == 0


@pytest.mark.asyncio
async def test_bad_calls_are_refused(device: aiordma.Device, pair: Pair) -> None:
    a, _ = pair
    src = device.alloc(BLOCK)
    readonly = device.register(bytes(BLOCK))
    with pytest.raises(ValueError, match="LOCAL_WRITE"):
        a.start_bulk(False, table(readonly, src, [(0, 0)]), 1, (readonly,), Outcome().done)
    with pytest.raises(ValueError, match="fewer than 2 records"):
        a.start_bulk(True, table(src, src, [(0, 0)]), 2, (src,), Outcome().done)
    assert src.inflight == 0
