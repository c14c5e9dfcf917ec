"""Taking MEDIUM messages off a channel as users write a stream (lab device).

``recv_message_into`` takes a MEDIUM message whose pieces all came in one
call (``Packets.take_medium``), and one still arriving through the receive
turn, its pieces copied from the completion drain (``receiver.py``). These
tests drive both on the device: streams whose messages span more pieces
than one drain batch (16 completions) and than the window, buffers too
short, and the data credits once a stream is over.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging

import pytest

import aiordma
from aiordma.channel.channel import MessageChannel
from aiordma.exceptions import BufferTooSmallError
from tests.channel.test_channel import _payload, channel_to, echo
from tests.conftest import Lab

WINDOW = 8
BUFFER = 1024
SIZES = (1_500, 17_000, 9_000, 40_000, 2_000, 33_000)
"""Two pieces; more than a drain batch; one window's worth; five windows."""
RINGS = pytest.mark.parametrize("ring", [0, 256 << 10], ids=["pieces", "records"])
"""Medium messages as MEDIUM packets and PIECEs (no ring), or as RECORDs."""


async def whole(channel: MessageChannel) -> None:
    """Wait until the first queued message has all its pieces."""
    async with asyncio.timeout(30):
        while (first := channel._inbox.first()) is None or first.missing:
            await channel._changed()


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
@RINGS
async def test_a_stream_of_medium_messages_lands_whole_in_order_and_gives_every_credit_back(
    lab: Lab, ring: int
) -> None:
    servers: list[MessageChannel] = []

    async def take_stream(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        servers.append(channel)
        into = bytearray(max(SIZES))
        digests = []
        while (n := await channel.recv_message_into(into)) != 0:
            digests.append(hashlib.sha256(into[:n]).digest())
        await channel.send_message(b"".join(digests))

    outgoing = [_payload(i, SIZES[i % len(SIZES)]) for i in range(30)]
    async with channel_to(
        lab, take_stream, window=WINDOW, buffer_size=BUFFER, ring_size=ring
    ) as channel:
        pending: set[asyncio.Future[None]] = set()
        for data in outgoing:  # eight in flight, as a user writes a stream
            if len(pending) >= 8:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending.add(asyncio.ensure_future(channel.send_message(data)))
        await asyncio.wait_for(asyncio.gather(*pending), 60)
        await channel.send_message(b"")
        digests = await asyncio.wait_for(channel.recv_message(), 60)
        assert digests == b"".join(hashlib.sha256(data).digest() for data in outgoing)
        # The server took everything before it answered, and its answer came
        # after any credit update it sent: every data buffer it posted is a
        # credit here or owed by it, none lost or counted twice.
        (server,) = servers
        assert channel._data_credits.available + server._data_credits.owed == WINDOW
        assert channel._data_credits.available <= channel._data_credits.limit
        assert server._inbox.queued() == 0


@pytest.mark.asyncio
@RINGS
async def test_a_whole_medium_message_is_taken_into_a_bytearray_or_a_memoryview(
    lab: Lab, ring: int
) -> None:
    async with channel_to(
        lab, echo, window=WINDOW * 4, buffer_size=BUFFER, ring_size=ring
    ) as channel:
        for i, size in enumerate((1_500, 17_000)):  # within the window: all pieces come
            data = _payload(i, size)
            await channel.send_message(data)
            await whole(channel)
            backing = bytearray(size + 100)
            into = bytearray(size) if i == 0 else memoryview(backing)[50:]
            assert await channel.recv_message_into(into) == size
            assert bytes(into[:size]) == data
            assert channel._inbox.queued() == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("pieces_to_come", [False, True], ids=["whole", "arriving"])
async def test_a_medium_message_refused_by_a_short_buffer_stays_queued_whole(
    lab: Lab, pieces_to_come: bool
) -> None:
    # A window of 4 holds back most of a 20,000-byte message until the
    # receiver takes it; a window of 32 lets all of it come first.
    window = 4 if pieces_to_come else 32
    async with channel_to(lab, echo, window=window, buffer_size=BUFFER, ring_size=0) as channel:
        data = _payload(7, 20_000)
        await channel.send_message(data)
        if pieces_to_come:
            await asyncio.wait_for(channel.wait_message(), 30)
            first = channel._inbox.first()
            assert first is not None
            assert first.missing > 0
        else:
            await whole(channel)
        with pytest.raises(BufferTooSmallError) as caught:
            await asyncio.wait_for(channel.recv_message_into(bytearray(19_999)), 30)
        assert (caught.value.needed, caught.value.given) == (20_000, 19_999)
        into = bytearray(20_000)
        assert await asyncio.wait_for(channel.recv_message_into(into), 30) == 20_000
        assert into == data


LARGE = 600_000
"""Above the staging buffer's 256 KiB: a large message taken as a new object
lands in a buffer of its own, and those behind it may be read ahead."""


async def burst(conn: aiordma.Connection) -> None:
    """Answer each ``b"count"`` with that many large messages sent at once,
    then ``b"sent"`` once the peer has read them all."""
    channel: MessageChannel = conn.prepared
    async for request in channel:
        count = int(bytes(request))
        await asyncio.gather(*(channel.send_message(_payload(i, LARGE)) for i in range(count)))
        await channel.send_message(b"sent")


async def queued(channel: MessageChannel, count: int) -> None:
    """Wait until ``count`` messages are queued."""
    async with asyncio.timeout(30):
        while channel._inbox.queued() < count:
            await channel._changed()


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_the_next_large_message_is_read_ahead_and_its_sender_released(lab: Lab) -> None:
    async with channel_to(lab, burst, medium_limit=0) as channel:

        def read_ahead() -> int:
            return int(channel.stats()["counters"].get("large_read_ahead", 0))

        async def take(i: int) -> None:
            assert await asyncio.wait_for(channel.recv_message(), 30) == _payload(i, LARGE)

        await channel.send_message(b"6")
        await queued(channel, 6)
        await take(0)
        assert read_ahead() == 1  # the one behind, and only that one
        await take(1)
        assert read_ahead() == 2
        into = bytearray(LARGE + 10)  # a buffer chosen after all: copied there
        assert await asyncio.wait_for(channel.recv_message_into(into), 30) == LARGE
        assert into[:LARGE] == _payload(2, LARGE)
        region = channel.conn.alloc(LARGE)  # read where it is: nothing read ahead
        assert await asyncio.wait_for(channel.recv_message_into(region), 30) == LARGE
        assert bytes(region.view()) == _payload(3, LARGE)
        assert read_ahead() == 2
        await take(4)  # a new object again: the last one is read ahead, and its
        await queued(channel, 2)  # sender told at once: it says "sent" before it is taken
        assert read_ahead() == 3
        await take(5)
        assert await asyncio.wait_for(channel.recv_message(), 30) == b"sent"
        # Taken into chosen buffers, nothing is read ahead.
        await channel.send_message(b"3")
        await queued(channel, 3)
        for i in range(3):
            assert await asyncio.wait_for(channel.recv_message_into(into), 30) == LARGE
            assert into[:LARGE] == _payload(i, LARGE)
        assert await asyncio.wait_for(channel.recv_message(), 30) == b"sent"
        assert read_ahead() == 3
        region.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("read_ahead", [0, LARGE - 1])
async def test_nothing_larger_than_read_ahead_is_read_before_it_is_asked_for(
    lab: Lab, read_ahead: int
) -> None:
    async with channel_to(lab, burst, medium_limit=0, read_ahead=read_ahead) as channel:
        await channel.send_message(b"3")
        await queued(channel, 3)
        for i in range(3):
            assert await asyncio.wait_for(channel.recv_message(), 30) == _payload(i, LARGE)
        assert await asyncio.wait_for(channel.recv_message(), 30) == b"sent"
        assert "large_read_ahead" not in channel.stats()["counters"]


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_receives_cancelled_at_any_moment_while_reading_ahead_lose_nothing(
    lab: Lab,
) -> None:
    async with channel_to(lab, burst, medium_limit=0) as channel:
        await channel.send_message(b"6")
        await queued(channel, 6)
        got = [await asyncio.wait_for(channel.recv_message(), 30)]
        turns = 0
        async with asyncio.timeout(60):
            while len(got) < 7:
                receive = asyncio.ensure_future(channel.recv_message())
                for _ in range(turns % 4):
                    await asyncio.sleep(0)
                receive.cancel()
                turns += 1
                await asyncio.wait([receive])
                if not receive.cancelled():
                    got.append(receive.result())
        assert turns > 6  # some were cancelled
        assert got == [*(_payload(i, LARGE) for i in range(6)), b"sent"]


@pytest.mark.asyncio
async def test_a_channel_closed_while_reading_ahead_fails_its_peers_sends_and_leaks_nothing(
    lab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    outcomes: list[BaseException | None] = []
    ended = asyncio.Event()

    async def send_many(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        await channel.recv_message()
        outcomes.extend(
            await asyncio.gather(
                *(channel.send_message(_payload(i, LARGE)) for i in range(6)),
                return_exceptions=True,
            )
        )
        ended.set()

    async with channel_to(lab, send_many, medium_limit=0) as channel:
        await channel.send_message(b"go")
        await queued(channel, 6)
        assert await asyncio.wait_for(channel.recv_message(), 30) == _payload(0, LARGE)
        assert channel.stats()["counters"]["large_read_ahead"] == 1
        await channel.close()
        with pytest.raises(aiordma.RdmaError):
            await channel.recv_message()
    await asyncio.wait_for(ended.wait(), 30)
    assert outcomes[0] is None
    assert all(o is None or isinstance(o, aiordma.ConnectionLostError) for o in outcomes)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
