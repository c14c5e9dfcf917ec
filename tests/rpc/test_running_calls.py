"""The calls an RPC server runs on one connection (pure logic, no device).

``Calls`` keeps the channel only to hand it to ``run``, so these tests give
it none and drive it with frames, as the channel's delivery hook would.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiordma import ProtocolError
from aiordma.channel import GIVE_BACK_AFTER
from aiordma.rpc._calls import Calls
from aiordma.rpc.frames import Frame, FrameKind

TIMEOUT = 5


class Handlers:
    """A ``run`` for :class:`Calls`: each call waits for its gate, if it has one."""

    def __init__(self, *gated: int) -> None:
        loop = asyncio.get_running_loop()
        self.gates: dict[int, asyncio.Future[None]] = {n: loop.create_future() for n in gated}
        self.ran: list[tuple[int, bytes]] = []
        self.cancelled: list[int] = []

    async def __call__(self, calls: Calls, frame: Frame, body: bytes | bytearray) -> None:
        self.ran.append((frame.call_id, bytes(body)))
        gate = self.gates.get(frame.call_id)
        if gate is not None:
            try:
                await gate
            except asyncio.CancelledError:
                self.cancelled.append(frame.call_id)
                raise


def request(call_id: int) -> bytes:
    return Frame(FrameKind.REQUEST, call_id, "m").pack()


def calls_with(handlers: Handlers, concurrency: int = 4, held: int = 1 << 20) -> Calls:
    channel: Any = None
    return Calls(channel, handlers, concurrency, held)


@pytest.mark.asyncio
async def test_a_handler_that_does_not_suspend_ends_within_the_delivery() -> None:
    handlers = Handlers()
    calls = calls_with(handlers)
    assert calls.on_message(request(1), memoryview(b"abc"))
    assert handlers.ran == [(1, b"abc")]
    assert calls.stats.gauges() == {
        "requests_held_bytes": 0, "results_held_bytes": 0, "calls_running": 0,
    }  # fmt: skip


@pytest.mark.asyncio
async def test_a_request_past_the_concurrency_stays_queued_until_a_call_ends() -> None:
    handlers = Handlers(1)
    calls = calls_with(handlers, concurrency=1)
    assert calls.on_message(request(1), b"x" * 10)
    assert calls.stats.gauges()["calls_running"] == 1
    assert calls.stats.gauges()["requests_held_bytes"] == 10
    assert not calls.on_message(request(2), b"y")  # left queued: no credit back yet
    room = asyncio.ensure_future(calls.room(None))
    await asyncio.sleep(0)
    assert not room.done()
    handlers.gates[1].set_result(None)
    async with asyncio.timeout(TIMEOUT):
        await room
    assert calls.stats.gauges()["calls_running"] == 0
    assert calls.stats.gauges()["requests_held_bytes"] == 0
    assert calls.on_message(request(2), b"y")


@pytest.mark.asyncio
async def test_held_bytes_bound_requests_but_never_refuse_the_first() -> None:
    handlers = Handlers(1)
    calls = calls_with(handlers, held=100)
    assert calls.on_message(request(1), b"a" * 150)  # nothing held: even a large one starts
    assert not calls.on_message(request(2), b"b")  # 150 held, over the budget
    handlers.gates[1].set_result(None)
    async with asyncio.timeout(TIMEOUT):
        await calls.room(1)
    assert calls.on_message(request(2), b"b")


@pytest.mark.asyncio
async def test_results_are_held_until_their_call_ends_and_large_ones_are_noted() -> None:
    handlers = Handlers(1)
    calls = calls_with(handlers, concurrency=1)  # room() waits for the call to end
    calls.dispatch(Frame(FrameKind.REQUEST, 1, "m"), b"r")
    calls.hold_result(1, GIVE_BACK_AFTER)
    assert calls.held_large
    assert calls.stats.gauges()["results_held_bytes"] == GIVE_BACK_AFTER
    handlers.gates[1].set_result(None)
    async with asyncio.timeout(TIMEOUT):
        await calls.room(None)
    assert calls.stats.gauges()["calls_running"] == 0
    assert calls.stats.gauges()["results_held_bytes"] == 0


@pytest.mark.asyncio
async def test_a_cancel_frame_reaches_its_handler_and_unknown_ones_are_ignored() -> None:
    handlers = Handlers(1)
    calls = calls_with(handlers, concurrency=1)  # room() waits for the call to end
    calls.dispatch(Frame(FrameKind.REQUEST, 1, "m"), b"")
    await asyncio.sleep(0)  # the handler waits at its gate
    calls.dispatch(Frame(FrameKind.CANCEL, 99), b"")  # no such call: nothing happens
    calls.dispatch(Frame(FrameKind.CANCEL, 1), b"")
    async with asyncio.timeout(TIMEOUT):
        await calls.room(None)
    assert handlers.cancelled == [1]


@pytest.mark.asyncio
async def test_a_reply_frame_from_a_client_is_a_protocol_error() -> None:
    calls = calls_with(Handlers())
    with pytest.raises(ProtocolError, match="a client sent a REPLY frame"):
        calls.dispatch(Frame(FrameKind.REPLY, 1), b"")


@pytest.mark.asyncio
async def test_cancel_all_spares_the_calls_sending_their_reply() -> None:
    handlers = Handlers(1, 2)
    calls = calls_with(handlers)
    calls.dispatch(Frame(FrameKind.REQUEST, 1, "m"), b"")
    calls.dispatch(Frame(FrameKind.REQUEST, 2, "m"), b"")
    await asyncio.sleep(0)
    calls.sending.add(2)
    ending = asyncio.ensure_future(calls.cancel_all())
    await asyncio.sleep(0)
    assert not ending.done()  # waits for call 2, which ends by itself
    handlers.gates[2].set_result(None)
    async with asyncio.timeout(TIMEOUT):
        await ending
    assert handlers.cancelled == [1]
    assert calls.stats.gauges()["calls_running"] == 0
