"""The window of pieces a channel's reads share (no device): who gets room first."""

from __future__ import annotations

import asyncio

import pytest

from aiordma.channel.rendezvous import _Window


@pytest.mark.asyncio
async def test_reads_of_the_message_taken_get_room_before_reads_ahead() -> None:
    window = _Window(2)
    assert window.take_now()
    await asyncio.wait_for(window.take(ahead=True), 1)  # free: at once
    assert not window.take_now()
    order: list[str] = []

    async def take(name: str, ahead: bool) -> None:
        await window.take(ahead)
        order.append(name)

    tasks = [
        asyncio.ensure_future(take(name, ahead))
        for name, ahead in (
            ("ahead 1", True),
            ("taken 1", False),
            ("ahead 2", True),
            ("taken 2", False),
        )
    ]
    await asyncio.sleep(0)  # each runs to its wait
    ahead_1, taken_1, ahead_2, taken_2 = tasks
    for task in (taken_1, taken_2, ahead_1, ahead_2):  # in this order, one room each
        window.give()
        await asyncio.wait_for(task, 1)
    assert order == ["taken 1", "taken 2", "ahead 1", "ahead 2"]
    window.give()
    assert window.take_now()  # free room again, once nobody waits
    assert not window.take_now()


@pytest.mark.asyncio
async def test_a_cancelled_taker_loses_no_room() -> None:
    window = _Window(1)
    assert window.take_now()
    waiting = asyncio.ensure_future(window.take(ahead=False))
    await asyncio.sleep(0)
    waiting.cancel()  # cancelled while waiting
    await asyncio.gather(waiting, return_exceptions=True)
    handed = asyncio.ensure_future(window.take(ahead=True))
    await asyncio.sleep(0)
    window.give()  # handed to it, and it is cancelled before it runs
    handed.cancel()
    await asyncio.gather(handed, return_exceptions=True)
    assert handed.cancelled()
    assert window.take_now()  # the room it was handed came back
    assert not window.take_now()
