"""The calls an RPC client has in flight (pure logic, no device)."""

from __future__ import annotations

import asyncio

import pytest

from aiordma import ProtocolError
from aiordma.metrics import Stats
from aiordma.rpc._pending import Pending
from aiordma.rpc.frames import Frame, FrameKind


@pytest.mark.asyncio
@pytest.mark.usefixtures("recording")
async def test_a_reply_finds_its_call_counted_and_timed() -> None:
    stats = Stats("rpc_client")
    pending = Pending(asyncio.get_running_loop(), stats)
    first_id, head, first = pending.start("echo", None)
    second_id, _, second = pending.start("echo", None)
    assert Frame.unpack(head) == Frame(FrameKind.REQUEST, first_id, "echo")
    assert second_id == first_id + 1
    assert len(pending) == 2
    frame, call = pending.take(Frame(FrameKind.REPLY, second_id).pack())
    assert (frame.call_id, call) == (second_id, second)
    frame, call = pending.take(Frame(FrameKind.ERROR, first_id).pack())
    assert (frame.kind, call) == (FrameKind.ERROR, first)
    assert len(pending) == 0
    assert stats.counters["calls"] == 2
    assert stats.histograms["call"].count == 2


@pytest.mark.asyncio
async def test_late_unknown_and_wrong_replies() -> None:
    pending = Pending(asyncio.get_running_loop(), Stats("rpc_client"))
    call_id, _, call = pending.start("slow", None)
    call.future.cancel()  # the caller gave up
    assert pending.take(Frame(FrameKind.REPLY, call_id).pack())[1] is None
    assert pending.take(Frame(FrameKind.REPLY, 999).pack())[1] is None
    with pytest.raises(ProtocolError, match="REQUEST"):
        pending.take(Frame(FrameKind.REQUEST, 1, "x").pack())
    with pytest.raises(ProtocolError, match="too short"):
        pending.take(b"\x02")


@pytest.mark.asyncio
async def test_drop_clear_and_a_name_too_long_records_nothing() -> None:
    pending = Pending(asyncio.get_running_loop(), Stats("rpc_client"))
    with pytest.raises(ValueError, match="at most 255"):
        pending.start("m" * 256, None)
    a, _, _ = pending.start("a", None)
    pending.start("b", None)
    assert pending.get(a) is not None
    assert pending.drop(a)
    assert not pending.drop(a)
    assert pending.get(a) is None
    assert [call.method for call in pending.clear()] == ["b"]
    assert len(pending) == 0
