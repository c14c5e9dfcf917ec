"""RECORDs: medium messages as one RDMA write into the peer's ring (lab device)."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import pytest

import aiordma
from aiordma.channel import records as records_module
from aiordma.channel.channel import MessageChannel
from aiordma.channel.open import channel_factory
from aiordma.channel.options import RING_SIZE, ChannelKeywords
from aiordma.channel.wire import HEADER_SIZE, Header, write_packet
from aiordma.exceptions import ConnectionLostError, RemoteAccessError
from tests.conftest import Lab

if TYPE_CHECKING:
    from typing_extensions import Unpack

pytestmark = pytest.mark.rdma

Handler = Callable[[MessageChannel], Awaitable[None]]


def _payload(i: int, size: int) -> bytes:
    block = hashlib.sha256(str(i).encode()).digest()
    return (block * (size // len(block) + 1))[:size]


@asynccontextmanager
async def pair(
    lab: Lab, handler: Handler, **options: Unpack[ChannelKeywords]
) -> AsyncIterator[tuple[MessageChannel, asyncio.Future[MessageChannel]]]:
    """A channel to an in-process server running ``handler``, and the
    server's side of it once it is up."""
    prepare = channel_factory(**options)
    loop = asyncio.get_running_loop()
    theirs: asyncio.Future[MessageChannel] = loop.create_future()

    async def serve(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        if not theirs.done():
            theirs.set_result(channel)
        await handler(channel)

    async with await aiordma.start_server(serve, lab.addr, 0, prepare=prepare) as server:
        port = server.addresses[0][1]
        async with await aiordma.connect(lab.addr, port, prepare=prepare) as conn:
            channel: MessageChannel = conn.prepared
            await asyncio.wait_for(channel._peer_limit(), 30)  # the HELLOs went both ways
            yield channel, theirs


async def echo(channel: MessageChannel) -> None:
    async for message in channel:
        await channel.send_message(message)


async def hold(channel: MessageChannel) -> None:
    """Read nothing until the connection closes."""
    await channel.wait_closed()


def posted(channel: MessageChannel) -> tuple[int, int]:
    gauges = channel.conn.qp.stats()["gauges"]
    return gauges["posted_sends"], gauges["posted_receives"]


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_a_medium_message_is_one_write_and_one_repost(lab: Lab) -> None:
    got: list[bytes] = []
    done = asyncio.Event()

    async def sink(channel: MessageChannel) -> None:
        target = bytearray(1 << 17)
        while len(got) < 20:
            n = await channel.recv_message_into(target)
            got.append(bytes(target[:n]))
        done.set()
        await channel.wait_closed()

    async with pair(lab, sink, ring_size=RING_SIZE) as (channel, theirs):
        server = await asyncio.wait_for(theirs, 30)
        mine_before, theirs_before = posted(channel), posted(server)
        for i in range(20):
            await channel.send_message(_payload(i, 64 << 10))
        await asyncio.wait_for(done.wait(), 30)
        mine, their = posted(channel), posted(server)
        assert got == [_payload(i, 64 << 10) for i in range(20)]
        assert mine[0] - mine_before[0] == 20  # one write each, nothing else sent
        assert their[1] - theirs_before[1] == 20  # one receive reposted each
        assert their[0] - theirs_before[0] < 20  # credit updates only, fewer than messages
        counters = channel.stats()["counters"]
        assert counters.get("large_sent", 0) == 0


@pytest.mark.asyncio
async def test_records_wrap_the_ring_in_order_with_small_and_large_messages(lab: Lab) -> None:
    """Random sizes up to the largest record (a quarter of the ring), around
    the ring many times: every boundary, each record checked as it lands,
    in order with eager messages and rendezvous ones between them."""
    ring = 16 << 10
    largest = ring // 4 - HEADER_SIZE  # the body of the largest record (no head)
    rng = random.Random(84)
    sizes = [rng.choice([1, 500, largest, largest + 1, 300_000]) for _ in range(30)]
    sizes += [rng.randint(1000, largest) for _ in range(120)]
    rng.shuffle(sizes)
    async with pair(lab, echo, ring_size=ring, buffer_size=1024) as (channel, _):
        assert channel._packets.state.fits_ring(largest)
        assert not channel._packets.state.fits_ring(largest + 1)

        async def send_all() -> None:
            for i, size in enumerate(sizes):
                await channel.send_message(_payload(i, size))

        sending = asyncio.ensure_future(send_all())
        for i, size in enumerate(sizes):
            body = await asyncio.wait_for(channel.recv_message(), 30)
            assert len(body) == size
            assert body == _payload(i, size), f"message {i} of {size} bytes"
        await asyncio.wait_for(sending, 30)
        writer = channel._packets.state.ring_out
        assert writer is not None
        assert writer._sequence > 100  # most went as records, many times round the ring


@pytest.mark.asyncio
async def test_a_reader_that_stops_holds_its_writer_back_and_loses_nothing(lab: Lab) -> None:
    reading = asyncio.Event()
    got: list[bytes] = []

    async def late(channel: MessageChannel) -> None:
        await reading.wait()
        for _ in range(40):
            got.append(bytes(await channel.recv_message()))
        await channel.send_message(b"done")

    ring = 64 << 10
    async with pair(lab, late, ring_size=ring, buffer_size=1024) as (channel, _):
        messages = [_payload(i, 10_000) for i in range(40)]
        sending = asyncio.ensure_future(asyncio.gather(*map(channel.send_message, messages)))
        writer = channel._packets.state.ring_out
        assert writer is not None
        async with asyncio.timeout(30):
            while writer.room_for(HEADER_SIZE + 10_000):  # the ring fills, then the writer waits
                await channel._changed()
        assert not sending.done()
        assert writer.free < ring // 4
        reading.set()
        await asyncio.wait_for(sending, 30)
        assert await asyncio.wait_for(channel.recv_message(), 30) == b"done"
    assert got == messages


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_a_record_cancelled_before_it_went_sends_nothing(lab: Lab) -> None:
    reading = asyncio.Event()

    async def late(channel: MessageChannel) -> None:
        await reading.wait()
        async for message in channel:
            await channel.send_message(message)

    async with pair(lab, late, ring_size=16 << 10, buffer_size=1024) as (channel, _):
        first = [channel.send_message(_payload(i, 3000)) for i in range(5)]
        await asyncio.wait_for(asyncio.gather(*first), 30)  # 15 of the ring's 16 KiB
        blocked = asyncio.ensure_future(channel.send_message(_payload(99, 4000)))
        await asyncio.sleep(0)  # its first step: no room, so it waits in the send turn
        assert channel._packets.senders == 1
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        await channel.send_message(b"after")
        reading.set()
        for i in range(5):
            assert await asyncio.wait_for(channel.recv_message(), 30) == _payload(i, 3000)
        assert await asyncio.wait_for(channel.recv_message(), 30) == b"after"


@pytest.mark.asyncio
async def test_a_writer_waiting_for_ring_space_fails_when_the_connection_closes(
    lab: Lab,
) -> None:
    async with pair(lab, hold, ring_size=16 << 10, buffer_size=1024) as (channel, theirs):
        server = await asyncio.wait_for(theirs, 30)
        sends = [asyncio.ensure_future(channel.send_message(_payload(i, 3000))) for i in range(8)]
        writer = channel._packets.state.ring_out
        assert writer is not None
        async with asyncio.timeout(30):
            while writer.room_for(HEADER_SIZE + 3000):
                await channel._changed()
        await server.close()  # the grant that would free the ring never comes
        results = await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 30)
        failed = [r for r in results if isinstance(r, BaseException)]
        assert failed, "every send went, though the ring was full"
        assert all(isinstance(r, ConnectionLostError | aiordma.ResourceClosedError) for r in failed)


@pytest.mark.asyncio
@pytest.mark.parametrize("breach", ["sequence", "grants", "length"])
async def test_a_peer_that_breaks_the_ring_rules_is_disconnected(
    lab: Lab, breach: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client plays a peer that breaks a rule (a record out of
    sequence, past its grants, or whose header disagrees with what was
    written): the server closes that connection with ProtocolError."""
    async with pair(lab, hold, ring_size=16 << 10, buffer_size=1024) as (channel, theirs):
        server = await asyncio.wait_for(theirs, 30)
        writer = channel._packets.state.ring_out
        assert writer is not None
        if breach == "sequence":
            writer._sequence += 1
        elif breach == "grants":  # a reader that reads nothing gives nothing back
            for i in range(3):
                await channel.send_message(_payload(i, 3000))
            writer.free = writer.size  # as if it had
        else:

            def longer(
                view: memoryview, start: int, room: int, header: Header, head: bytes, body: object
            ) -> int:
                length = write_packet(view, start, room, header, head, body)
                view[start + 16 : start + 24] = (header.length + 1).to_bytes(8, "little")
                return length

            monkeypatch.setattr(records_module, "write_packet", longer)
        sends = [channel.send_message(_payload(10 + i, 3000)) for i in range(3)]
        await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 30)
        await asyncio.wait_for(server.wait_closed(), 30)
        assert isinstance(server._error, aiordma.ProtocolError), server._error


@pytest.mark.asyncio
async def test_the_ring_is_writable_by_its_own_connection_only(lab: Lab) -> None:
    """The ring's window is bound to the server side's queue pair: another
    queue pair of the same protection domain holding its rkey gets a remote
    access error, and the ring's region itself grants no remote access."""
    async with pair(lab, hold, ring_size=16 << 10) as (channel, theirs):
        server = await asyncio.wait_for(theirs, 30)
        records = server._records
        assert records is not None
        window = records.window
        assert window is not None
        assert window.type == 2
        assert window.qp_num == server.conn.qp.qp_num
        assert window.access == aiordma.Access.REMOTE_WRITE
        assert not records._ring.access & aiordma.Access.REMOTE
        target = window.remote
        port = channel.conn.peer_address[1]
        async with await aiordma.connect(lab.addr, port, prepare=channel_factory()) as other:
            source = other.alloc(64)
            with pytest.raises(RemoteAccessError):
                await asyncio.wait_for(other.rdma_write(source, target[:64]), 30)


@pytest.mark.asyncio
async def test_a_channel_without_a_ring_talks_to_one_with_a_ring(lab: Lab) -> None:
    """Each side decides its own ring (none by default), and only a side with staging writes
    into the peer's: medium messages between these two go in pieces both
    ways, whole."""

    async def serve(conn: aiordma.Connection) -> None:
        await echo(conn.prepared)

    with_ring = channel_factory(ring_size=RING_SIZE)
    async with await aiordma.start_server(serve, lab.addr, 0, prepare=with_ring) as server:
        port = server.addresses[0][1]
        prepare = channel_factory(ring_size=0)
        async with await aiordma.connect(lab.addr, port, prepare=prepare) as conn:
            channel: MessageChannel = conn.prepared
            assert channel._records is None
            for i, size in enumerate([20_000, 100_000]):
                await channel.send_message(_payload(i, size))
                assert await asyncio.wait_for(channel.recv_message(), 30) == _payload(i, size)
            state = channel._packets.state
            assert (state.ring_in, state.ring_out) == (None, None)
