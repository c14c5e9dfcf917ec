"""Registered blocks that large Dask frames land in (lab device)."""

from __future__ import annotations

import asyncio
import gc

import numpy as np
import pytest
from distributed.comm.core import connect
from distributed.protocol.serialize import to_serialize

import aiordma
from aiordma.dask.landing import SMALLEST, LandingPool, block_size, pool_for
from tests.conftest import Lab
from tests.dask.test_comm import TIMEOUT, listening

MIB = 1 << 20


def test_blocks_are_powers_of_two_from_the_smallest() -> None:
    assert block_size(1) == SMALLEST
    assert block_size(SMALLEST) == SMALLEST
    assert block_size(SMALLEST + 1) == 2 * SMALLEST
    assert block_size(3 * MIB) == 4 * MIB


@pytest.mark.asyncio
async def test_a_block_goes_back_when_the_last_view_of_its_frame_is_gone(lab: Lab) -> None:
    device = aiordma.Device.shared(lab.device)
    pool = LandingPool(device, capacity=4 * MIB)
    try:
        placed = pool.take(MIB)
        assert placed is not None
        frame, segment = placed
        assert (len(frame), len(segment), frame.readonly) == (MIB, MIB, False)
        assert segment.mr.access == aiordma.Access.LOCAL_WRITE
        array = np.frombuffer(frame, dtype=np.uint8)[10:20]  # a view of a view
        del frame, placed
        gc.collect()
        assert pool.lent == 1  # the slice still holds it
        array[:] = 7
        assert bytes(segment.mr.view()[10:20]) == b"\x07" * 10
        del array
        gc.collect()
        assert pool.lent == 0
        again = pool.take(MIB - 1)
        assert again is not None
        assert again[1].mr is segment.mr  # the same block, lent again
        assert pool.held == MIB
    finally:
        pool.close()


@pytest.mark.asyncio
async def test_a_full_pool_places_nothing_and_frees_idle_blocks_for_other_sizes(lab: Lab) -> None:
    device = aiordma.Device.shared(lab.device)
    pool = LandingPool(device, capacity=2 * MIB)
    try:
        first = pool.take(MIB)
        second = pool.take(MIB)
        assert first is not None
        assert second is not None
        assert pool.take(MIB) is None  # full: the caller lands the frame elsewhere
        assert pool.take(4 * MIB) is None  # larger than the pool
        del first, second
        gc.collect()
        wide = pool.take(2 * MIB)  # the two idle 1 MiB blocks make room
        assert wide is not None
        assert pool.held == 2 * MIB
        kept = wide[1].mr
        del wide
        gc.collect()
    finally:
        pool.close()
    assert kept.closed  # free blocks are released with the pool
    assert pool.take(MIB) is None


@pytest.mark.asyncio
async def test_large_frames_land_in_the_devices_pool_and_go_back_with_the_array(
    lab: Lab,
) -> None:
    got: asyncio.Queue[object] = asyncio.Queue()

    async def keep(comm):  # type: ignore[no-untyped-def]
        await got.put(await comm.read())
        await comm.close()

    size = 3 * MIB
    device = aiordma.Device.shared(lab.device)
    pool = pool_for(device)
    lent = pool.lent
    array = np.arange(size, dtype=np.uint8)
    async with listening(lab, keep) as listener:
        comm = await connect(listener.contact_address, timeout=TIMEOUT)
        try:
            await comm.write({"array": to_serialize(array)})
            msg = await asyncio.wait_for(got.get(), TIMEOUT)
        finally:
            await comm.close()
    assert isinstance(msg, dict)
    assert np.array_equal(msg["array"], array)
    assert msg["array"].flags.writeable
    assert pool.lent == lent + 1
    del msg
    gc.collect()
    assert pool.lent == lent
