"""Slot accounting (pure logic, no device)."""

from __future__ import annotations

import asyncio
import traceback

import pytest

from aiordma.verbs._room import QueueRoom


@pytest.mark.asyncio
async def test_acquire_waits_fifo_and_release_wakes_in_order() -> None:
    pool = QueueRoom(2)
    await pool.acquire(2)
    order: list[str] = []

    async def take(name: str, n: int) -> None:
        await pool.acquire(n)
        order.append(name)

    big = asyncio.create_task(take("big", 2))
    small = asyncio.create_task(take("small", 1))
    await asyncio.sleep(0)
    pool.release(1)  # one free: "big" is first in line and needs two, "small" must not overtake
    await asyncio.sleep(0)
    assert order == []
    pool.release(1)
    await asyncio.wait_for(big, 1)
    assert order == ["big"]
    pool.release(1)
    await asyncio.wait_for(small, 1)
    assert order == ["big", "small"]
    assert pool.free == 0


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_cancelled_waiter_gives_way_and_leaks_nothing() -> None:
    pool = QueueRoom(2)
    await pool.acquire(1)
    blocked = asyncio.create_task(pool.acquire(2))
    behind = asyncio.create_task(pool.acquire(1))
    await asyncio.sleep(0)
    assert not behind.done()
    blocked.cancel()
    await asyncio.wait_for(behind, 1)  # the cancelled big request no longer blocks the queue
    assert pool.free == 0
    pool.release(2)
    assert pool.free == 2


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_cancellation_after_grant_returns_the_slots() -> None:
    pool = QueueRoom(1)
    await pool.acquire(1)
    waiter = asyncio.create_task(pool.acquire(1))
    await asyncio.sleep(0)
    pool.release(1)  # granted to waiter...
    waiter.cancel()  # ...but cancelled before it could run
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert pool.free == 1


@pytest.mark.asyncio
async def test_fail_wakes_waiters_and_refuses_later_acquires() -> None:
    pool = QueueRoom(1)
    await pool.acquire(1)
    waiter = asyncio.create_task(pool.acquire(1))
    await asyncio.sleep(0)
    pool.fail(RuntimeError("closed"))
    with pytest.raises(RuntimeError, match="closed"):
        await waiter
    with pytest.raises(RuntimeError, match="closed"):
        await pool.acquire(1)


@pytest.mark.asyncio
async def test_impossible_requests_are_rejected() -> None:
    pool = QueueRoom(4)
    with pytest.raises(ValueError, match="cannot take 5 of 4"):
        await pool.acquire(5)
    with pytest.raises(ValueError, match="at least one entry"):
        QueueRoom(0)


def test_a_failure_raised_again_and_again_keeps_its_own_traceback() -> None:
    """One exception object raised at every later acquire: its traceback is
    the one it failed with, not one that grows by a frame per raise."""
    pool = QueueRoom(1)
    try:
        raise ConnectionResetError("gone")
    except ConnectionResetError as exc:
        pool.fail(exc)
    depths = []
    for _ in range(3):
        with pytest.raises(ConnectionResetError) as info:
            pool.try_acquire(1)
        depths.append(len(list(traceback.walk_tb(info.value.__traceback__))))
    assert depths[0] == depths[1] == depths[2]
