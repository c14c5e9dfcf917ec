"""Message channels over a real connection (lab device, asyncio and uvloop)."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import os
import random
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import aiordma
from aiordma import Access
from aiordma.channel.channel import MessageChannel
from aiordma.channel.inbox import Phase
from aiordma.channel.open import channel_factory, prepare_channel
from aiordma.channel.options import ChannelKeywords
from aiordma.channel.rendezvous import STAGED_READ_LIMIT
from aiordma.channel.wire import ENTRY_SIZE, HEADER_SIZE, Header, Kind
from aiordma.exceptions import BufferTooSmallError, MessageTooLargeError, ProtocolError
from aiordma.metrics import Stats
from tests.conftest import Lab, echo_messages, rdma_counts

if TYPE_CHECKING:
    from typing_extensions import Unpack


def _payload(i: int, size: int) -> bytes:
    block = hashlib.sha256(str(i).encode()).digest()
    return (block * (size // len(block) + 1))[:size]


Handler = Callable[[aiordma.Connection], Awaitable[None]]


async def exposures_ended(channel: MessageChannel) -> None:
    """Wait until ``channel`` holds nothing exposed: a revoked message stays
    readable until the peer answers the REVOKE (it may be reading it)."""
    async with asyncio.timeout(30):
        while channel.exposed_bytes:
            await channel._changed()


@asynccontextmanager
async def channel_to(
    lab: Lab, handler: Handler, **options: Unpack[ChannelKeywords]
) -> AsyncIterator[MessageChannel]:
    """A channel to an in-process server running ``handler`` on each connection."""
    prepare = channel_factory(**options)
    async with await aiordma.start_server(handler, lab.addr, 0, prepare=prepare) as server:
        port = server.addresses[0][1]
        async with await aiordma.connect(lab.addr, port, prepare=prepare) as conn:
            yield conn.prepared


def collector(count: int) -> tuple[list[bytes], asyncio.Event, Handler]:
    """A handler that keeps every message its channel receives, the list it
    keeps them in, and an event set once ``count`` have arrived."""
    got: list[bytes] = []
    done = asyncio.Event()

    async def serve(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        async for message in channel:
            got.append(bytes(message))
            if len(got) == count:
                done.set()

    return got, done, serve


async def echo(conn: aiordma.Connection) -> None:
    channel: MessageChannel = conn.prepared
    async for message in channel:
        await channel.send_message(message)


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_mixed_sizes_arrive_in_order_both_ways(lab: Lab) -> None:
    rng = random.Random(4)
    sizes = [0, 1, 100, 8000, 8152, 8153, 70_000, 1 << 20]
    outgoing = [_payload(i, rng.choice(sizes)) for i in range(60)]
    got: list[bytes] = []

    async def serve(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        async for message in channel:
            got.append(bytes(message))
            await channel.send_message(message[::-1])

    async with channel_to(lab, serve) as channel:
        sender = asyncio.gather(*(channel.send_message(m) for m in outgoing))
        replies = [bytes(await asyncio.wait_for(channel.recv_message(), 60)) for _ in outgoing]
        await sender
    assert got == outgoing
    assert replies == [m[::-1] for m in outgoing]


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_send_messages_delivers_a_batch_in_order_past_the_window(lab: Lab) -> None:
    """Small ones in chains (more than the window: the rest waits for credit
    in the send turn), medium and large ones between them, all in order, and
    each counted once."""
    sizes = [1, 64, 0, 8000] * 10 + [70_000] + [5] * 20 + [1 << 20] + [7] * 3
    outgoing = [_payload(i, size) for i, size in enumerate(sizes)]
    got, done, serve = collector(len(outgoing))
    async with channel_to(lab, serve, window=8) as channel:
        await asyncio.wait_for(channel.send_messages(iter(outgoing)), 60)
        await asyncio.wait_for(done.wait(), 60)
        assert channel.stats()["counters"]["messages_sent"] == len(outgoing)
    assert got == outgoing


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_small_messages_share_packets_and_a_reader_behind_still_holds_the_sender(
    lab: Lab,
) -> None:
    """``send_messages`` packs 64-byte messages about a hundred to a packet
    (BATCH); each arrives as a message of its own, in order, and a batch's
    credit comes back only once its last message is read, so the sender is
    never more than the window's packets ahead of the reader."""
    count, window = 1000, 2
    per_packet = (8192 - HEADER_SIZE) // (ENTRY_SIZE + 64)
    outgoing = [_payload(i, 64) for i in range(count)]
    got, done, serve = collector(count)
    async with channel_to(lab, serve, window=window) as channel:
        await asyncio.wait_for(channel.send_messages(outgoing), 60)
        read_when_sent = len(got)
        await asyncio.wait_for(done.wait(), 60)
        counters = channel.stats()["counters"]
    assert got == outgoing
    assert read_when_sent >= count - window * per_packet
    assert counters["credit_stalls"] > 0
    assert counters["messages_sent"] == count


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_recv_messages_takes_what_is_queued_in_order_up_to_its_limit(lab: Lab) -> None:
    """``recv_messages``: every message in order, small ones queued together
    in one list, a larger one only at a list's head, never more than
    ``limit``; a bad limit raises before waiting, and one cancelled while
    waiting takes nothing."""
    sizes = [64] * 300 + [70_000] + [5] * 40 + [1 << 20] + [3] * 3
    outgoing = [_payload(i, size) for i, size in enumerate(sizes)]

    async def serve(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        while await channel.recv_message() == b"go":
            await channel.send_messages(outgoing)

    async def take(channel: MessageChannel, limit: int | None) -> list[list[bytes]]:
        lists: list[list[bytes]] = []
        while sum(map(len, lists)) < len(outgoing):
            got = await asyncio.wait_for(channel.recv_messages(limit), 60)
            lists.append([bytes(m) for m in got])
        return lists

    async with channel_to(lab, serve) as channel:
        with pytest.raises(ValueError, match="limit"):
            await channel.recv_messages(0)
        with pytest.raises(TypeError, match="limit"):
            await channel.recv_messages(2.0)  # type: ignore[arg-type]
        with pytest.raises(TimeoutError):  # nothing sent yet
            await asyncio.wait_for(channel.recv_messages(), 0.05)
        await channel.send_message(b"go")
        unbounded = await take(channel, None)
        await channel.send_message(b"go")
        bounded = await take(channel, 7)
        await channel.send_message(b"end")
    for lists in (unbounded, bounded):
        assert [m for got in lists for m in got] == outgoing
        assert all(len(m) <= 64 for got in lists for m in got[1:])  # larger ones head a list
    assert max(map(len, unbounded)) > 7  # a batch's messages came together
    assert max(map(len, bounded)) == 7


@pytest.mark.asyncio
async def test_send_messages_refuses_a_bad_batch_before_sending_any(lab: Lab) -> None:
    got, arrived, serve = collector(1)
    async with channel_to(lab, serve, max_message=1 << 16) as channel:
        with pytest.raises(MessageTooLargeError, match="70000 bytes"):
            await channel.send_messages([b"a", b"b", bytes(70_000)])
        with pytest.raises(TypeError):
            await channel.send_messages([b"a", memoryview(bytes(8))[::2]])
        with pytest.raises(TypeError, match=r"an iterable of messages, not one message \(bytes\)"):
            await channel.send_messages(b"abc")  # type: ignore[arg-type]  # issue 81: "not int"
        await channel.send_messages([])
        await channel.send_messages([b"only"])
        await asyncio.wait_for(arrived.wait(), 30)
    assert got == [b"only"]


@pytest.mark.asyncio
async def test_memory_of_another_device_object_and_a_bad_flag_are_refused(lab: Lab) -> None:
    """Issue 81: send_message and recv_message_into took memory registered
    with another Device object (a queue pair, and call(into=), refuse it),
    and until_unexposed="yes"."""
    async with channel_to(lab, echo) as channel, aiordma.Device(lab.device) as other:
        assert other is not channel.conn.device
        foreign = other.alloc(4096)
        for body in (foreign, foreign[:100]):
            with pytest.raises(ValueError, match="registered on another Device"):
                await channel.send_message(body)
            with pytest.raises(ValueError, match="registered on another Device"):
                await channel.send_messages([b"a", body])
            with pytest.raises(ValueError, match="registered on another Device"):
                await channel.recv_message_into(body)
        with pytest.raises(TypeError, match="until_unexposed must be a bool, not 'yes'"):
            await channel.send_message(b"x", until_unexposed="yes")  # type: ignore[arg-type]
        await channel.send_message(channel.conn.register(b"mine"))
        assert await asyncio.wait_for(channel.recv_message(), 30) == b"mine"


def _sizes(count: int, seed: int) -> list[int]:
    """Mostly small, some medium, and a few of 16 MiB: bytes to 16 MiB."""
    rng = random.Random(seed)
    sizes = []
    for i in range(count):
        if i % 1000 == 999:
            sizes.append(16 << 20)
        elif i % 50 == 49:
            sizes.append(rng.randrange(8 << 10, 1 << 20))
        else:
            sizes.append(rng.choice([0, 1, 7, 64, 512, 4096, 8152]))
    return sizes


@pytest.mark.asyncio
@pytest.mark.parametrize("count", [1_000, pytest.param(10_000, marks=pytest.mark.slow)])
async def test_thousands_of_mixed_messages_reach_another_process_in_order(
    lab: Lab, checksum_server: int, count: int
) -> None:
    sizes = _sizes(count, seed=5)
    big = {size: _payload(size, size) for size in set(sizes) if size > 8 << 10}

    def message(i: int) -> bytes:
        size = sizes[i]
        if size in big:
            return i.to_bytes(8, "little") + big[size][8:]
        return _payload(i, size)

    async with await aiordma.connect(lab.addr, checksum_server, prepare=prepare_channel) as conn:
        channel: MessageChannel = conn.prepared

        async def send_all() -> None:
            for i in range(len(sizes)):
                await channel.send_message(message(i))

        sender = asyncio.create_task(send_all())
        for i in range(len(sizes)):
            digest = await asyncio.wait_for(channel.recv_message(), 60)
            assert digest == hashlib.sha256(message(i)).digest(), f"message {i} ({sizes[i]} B)"
        await sender
    assert sizes.count(16 << 20) == count // 1000  # large messages among the small ones


def _rnr_counters(device: str) -> dict[str, int]:
    base = Path(f"/sys/class/infiniband/{device}/ports/1/hw_counters")
    return {name: int((base / name).read_text()) for name in ("rcvd_rnr_err", "send_rnr_err")}


@pytest.mark.asyncio
async def test_fast_sender_is_held_back_by_a_slow_receiver_without_rnr(lab: Lab) -> None:
    count, window = 120, 8
    consumed = 0
    consumed_when_sender_done = -1
    received: list[bytes] = []
    finished = asyncio.Event()

    async def slow(conn: aiordma.Connection) -> None:
        nonlocal consumed
        channel: MessageChannel = conn.prepared
        for _ in range(count):
            received.append(bytes(await channel.recv_message()))
            consumed += 1
            await asyncio.sleep(0.005)  # the receiver's "work": 100x a send's cost
        finished.set()
        await channel.send_message(b"bye")

    before = _rnr_counters(lab.device)
    async with channel_to(lab, slow, window=window) as channel:
        for i in range(count):
            await channel.send_message(b"%d" % i)
        consumed_when_sender_done = consumed
        await asyncio.wait_for(finished.wait(), 60)
        assert await asyncio.wait_for(channel.recv_message(), 30) == b"bye"
    assert received == [b"%d" % i for i in range(count)]
    # Without flow control the sender would finish long before the receiver;
    # with it, it can be at most the credit window ahead.
    assert consumed_when_sender_done >= count - window
    assert _rnr_counters(lab.device) == before


@pytest.mark.asyncio
async def test_oversized_message_is_refused_and_the_channel_stays_usable(lab: Lab) -> None:
    async with channel_to(lab, echo) as channel:
        with pytest.raises(MessageTooLargeError, match="max_message"):
            await channel.send_message(bytes(channel.max_message + 1))
        await channel.send_message(b"still fine")
        assert await asyncio.wait_for(channel.recv_message(), 30) == b"still fine"


@pytest.mark.asyncio
async def test_a_body_that_is_not_one_contiguous_buffer_is_refused_and_the_channel_stays_usable(
    lab: Lab,
) -> None:
    """Issue 41: a strided view was half-sent, and the channel failed every
    later send. Each size takes another path (one packet, pieces, rendezvous)."""
    async with channel_to(lab, echo) as channel:
        for size in (100, 20_000, 400_000):
            strided = memoryview(bytearray(size))[::2]
            with pytest.raises(TypeError, match="C-contiguous"):
                await channel.send_message(strided)
            with pytest.raises(TypeError, match="C-contiguous"):
                await channel.post_message(strided)
            with pytest.raises(TypeError, match="bytes-like"):
                await channel.send_message("text")  # type: ignore[arg-type]
            whole = _payload(size, size // 2)
            await channel.send_message(whole)
            assert await asyncio.wait_for(channel.recv_message(), 30) == whole
        assert not channel.is_closing()


@pytest.mark.asyncio
async def test_receiving_into_registered_memory(lab: Lab) -> None:
    async with channel_to(lab, echo) as channel:
        region = channel.conn.alloc(1 << 20)
        big, small = _payload(1, 300_000), b"small one"
        for data in (big, small):
            await channel.send_message(data)
            n = await asyncio.wait_for(channel.recv_message_into(region), 30)
            assert bytes(region.view()[:n]) == data
        await channel.send_message(big)
        with pytest.raises(BufferTooSmallError, match="300000 bytes"):
            await channel.recv_message_into(bytearray(1000))
        # The message was not consumed: a big enough buffer still gets it.
        target = bytearray(300_000)
        assert await asyncio.wait_for(channel.recv_message_into(target), 30) == 300_000
        assert target == big


@pytest.mark.asyncio
async def test_medium_messages_are_copied_in_pieces_and_register_nothing(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bodies above the eager limit and up to ``medium_limit`` travel as
    packets through the registered slots, even when they are many windows
    long; the next size up goes by rendezvous."""
    options: ChannelKeywords = {
        "window": 4,
        "buffer_size": 1024,
        "medium_limit": 40_000,
        "ring_size": 0,
    }
    async with channel_to(lab, echo, **options) as channel:
        registered: list[object] = []
        register = channel.conn.register

        def recording_register(obj: object, *args: aiordma.Access) -> aiordma.MemoryRegion:
            registered.append(obj)
            return register(obj, *args)

        monkeypatch.setattr(channel.conn, "register", recording_register)
        sizes = [channel.eager_limit + 1, 20_000, 40_000]
        for i, size in enumerate(sizes):
            data = _payload(i, size)
            await channel.send_message(data, head=b"h%d" % i)
            head, body = await asyncio.wait_for(channel.recv_message_with_head(), 30)
            assert head == b""  # the echo sends the body back alone
            assert (type(body), body) == (bytearray, data)
            target = bytearray(size + 5)
            await channel.send_message(memoryview(data))
            assert await asyncio.wait_for(channel.recv_message_into(target), 30) == size
            assert target[:size] == data
        assert registered == []
        assert channel.stats()["counters"].get("large_sent", 0) == 0
        await channel.send_message(_payload(9, 40_001))
        assert await asyncio.wait_for(channel.recv_message(), 30) == _payload(9, 40_001)
        assert [type(obj) for obj in registered] == [bytes]  # that one was exposed


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_a_receive_cancelled_inside_a_medium_message_leaves_it_whole(lab: Lab) -> None:
    async with channel_to(lab, echo, window=4, buffer_size=1024, ring_size=0) as channel:
        data = _payload(1, 30_000)  # some 30 packets against 4 credits
        await channel.send_message(data, head=b"head")
        await asyncio.wait_for(channel.wait_message(), 30)
        target = bytearray(30_000)
        receiving = asyncio.ensure_future(channel.recv_message_into(target))
        await asyncio.sleep(0)  # it copies what is there, then waits for the rest
        receiving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await receiving
        first = channel._inbox.first()
        assert first is not None
        assert first.phase == Phase.KEPT
        partial = first.copied
        assert partial is not None
        assert 0 < len(partial) < 30_000  # cancelled part-way: the rest is still to come
        head, body = await asyncio.wait_for(channel.recv_message_with_head(), 30)
        assert head == b""
        assert body == data
        await channel.send_message(b"next")
        assert await asyncio.wait_for(channel.recv_message(), 30) == b"next"


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_a_send_cancelled_inside_a_medium_message_still_delivers_it_whole(
    lab: Lab,
) -> None:
    go = asyncio.Event()
    got: list[tuple[bytes, bytes | bytearray | int]] = []

    async def late(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        await go.wait()
        for _ in range(2):
            got.append(await channel.recv_message_with_head())
        await channel.send_message(b"done")

    async with channel_to(lab, late, window=4, buffer_size=1024, ring_size=0) as channel:
        await asyncio.wait_for(channel._peer_limit(), 30)  # the peer's HELLO came
        data = bytearray(_payload(2, 30_000))
        sending = asyncio.ensure_future(channel.send_message(data, head=b"first"))
        await asyncio.sleep(0)  # it sends what the credits allow, then waits
        assert not sending.done()
        sending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sending
        data[:] = bytes(len(data))  # the rest was copied: the caller may reuse it
        after = asyncio.ensure_future(channel.send_message(b"after"))
        go.set()
        await asyncio.wait_for(after, 30)
        assert await asyncio.wait_for(channel.recv_message(), 30) == b"done"
    assert got == [(b"first", _payload(2, 30_000)), (b"", b"after")]


@pytest.mark.asyncio
async def test_rendezvous_messages_for_plain_memory_go_through_one_staging_buffer(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with channel_to(lab, echo, medium_limit=0) as channel:
        registered: list[object] = []
        register = channel.conn.register

        def recording_register(obj: object, *args: aiordma.Access) -> aiordma.MemoryRegion:
            registered.append(obj)
            return register(obj, *args)

        monkeypatch.setattr(channel.conn, "register", recording_register)
        limit = STAGED_READ_LIMIT
        target = bytearray(limit)
        for i, size in enumerate((20_000, limit, 70_000)):
            data = _payload(i, size)
            await channel.send_message(data)
            if i % 2:
                assert await asyncio.wait_for(channel.recv_message_into(target), 30) == size
                assert target[:size] == data
            else:
                got = await asyncio.wait_for(channel.recv_message(), 30)
                assert (type(got), got) == (bytearray, data)
        # This side registered its three exposures (bytes) and none of the
        # destinations it received into.
        assert [type(obj) for obj in registered] == [bytes] * 3
        # Above the limit the destination itself is registered (no copy).
        big = _payload(9, limit + 1)
        await channel.send_message(big)
        target = bytearray(limit + 1)
        assert await asyncio.wait_for(channel.recv_message_into(target), 30) == limit + 1
        assert target == big
        assert target in registered


@pytest.mark.asyncio
async def test_a_large_send_from_registered_memory_is_read_in_place_through_its_own_rkey(
    lab: Lab, checksum_server: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await aiordma.connect(lab.addr, checksum_server, prepare=prepare_channel) as conn:
        channel: MessageChannel = conn.prepared
        source = conn.alloc(900_000, Access.REMOTE_READ)
        source.view()[:] = _payload(7, 900_000)
        registered: list[aiordma.MemoryRegion] = []
        register = conn.register

        def recording_register(obj: object, *args: aiordma.Access) -> aiordma.MemoryRegion:
            mr = register(obj, *args)
            registered.append(mr)
            return mr

        monkeypatch.setattr(conn, "register", recording_register)
        sending = asyncio.create_task(channel.send_message(source[300_000:600_000]))
        digest = await asyncio.wait_for(channel.recv_message(), 30)
        await sending
        assert digest == hashlib.sha256(_payload(7, 900_000)[300_000:600_000]).digest()
        # Exposed where it is (no copy), as exactly its bytes, and only until DONE.
        (exposure,) = registered
        assert (exposure.addr, exposure.length) == (source.addr + 300_000, 300_000)
        assert exposure.access == Access.REMOTE_READ
        assert exposure.rkey != source.rkey
        assert exposure.closed


@pytest.mark.asyncio
@pytest.mark.parametrize(("read_piece", "reads"), [(None, 2), (256 << 10, 8)])
async def test_large_messages_from_the_same_device_are_read_in_megabyte_pieces(
    lab: Lab, read_piece: int | None, reads: int
) -> None:
    """A peer at the connection's own address is on the same device: its
    large messages are read 1 MiB at a time unless ``read_piece`` says otherwise."""
    data = _payload(9, 2 << 20)

    async def send(conn: aiordma.Connection) -> None:
        assert conn.loopback
        channel: MessageChannel = conn.prepared
        await channel.send_message(data)
        await channel.recv_message()  # until the receiver has it

    async with channel_to(lab, send, read_piece=read_piece) as channel:
        before = channel.conn.qp.stats()["counters"].get("ops:batched", 0)
        assert await asyncio.wait_for(channel.recv_message(), 60) == data
        assert channel.conn.qp.stats()["counters"].get("ops:batched", 0) - before == reads
        await channel.send_message(b"")


@pytest.mark.asyncio
async def test_a_posted_large_message_is_delivered_after_the_post_returns(lab: Lab) -> None:
    """post_message returns once the announcement is posted; its future
    resolves when the peer has read the message, and cancelling it revokes."""
    size = 512 << 10
    announced, finished, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
    got: list[object] = []

    async def receive(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        first = await channel.recv_message()
        await channel.send_message(hashlib.sha256(first).digest())
        await _take_withdrawn_then_next(channel, announced, got)
        finished.set()
        await release.wait()  # returning closes the connection

    async with channel_to(lab, receive) as channel:
        try:
            data = _payload(3, size)
            delivered = await asyncio.wait_for(channel.post_message(data), 60)
            assert not delivered.done()  # the peer reads it when it asks for it
            assert channel.exposed_bytes == size
            digest = await asyncio.wait_for(channel.recv_message(), 60)
            assert digest == hashlib.sha256(data).digest()
            await asyncio.wait_for(delivered, 60)
            withdrawn = await asyncio.wait_for(channel.post_message(_payload(4, size)), 60)
            await asyncio.wait_for(announced.wait(), 60)
            withdrawn.cancel()
            await exposures_ended(channel)  # the peer answered the REVOKE
            await channel.send_message(b"next")
            await asyncio.wait_for(finished.wait(), 60)
            small = await channel.post_message(b"small")
            assert small.done()  # copied into a send buffer: nothing to wait for
        finally:
            release.set()
    assert isinstance(got[0], aiordma.MessageRevokedError)
    assert got[1] == b"next"


@pytest.mark.asyncio
async def test_delivery_futures_left_unawaited_at_close_are_not_reported(lab: Lab) -> None:
    """Issue 81: each dropped post_message() future of a large message made
    asyncio log "Future exception was never retrieved" at a clean close (the
    loop_errors fixture fails the test on such a report); one kept still
    raises."""
    release = asyncio.Event()

    async def never_reads(conn: aiordma.Connection) -> None:
        await release.wait()

    async with channel_to(lab, never_reads) as channel:
        try:
            kept = await asyncio.wait_for(channel.post_message(_payload(5, 512 << 10)), 60)
            for seed in (6, 7):
                await asyncio.wait_for(channel.post_message(_payload(seed, 512 << 10)), 60)
            assert channel.exposed_bytes == 3 * (512 << 10)
            await asyncio.wait_for(channel.aclose(), 60)
        finally:
            release.set()
    gc.collect()  # the two dropped futures go now, on this loop
    with pytest.raises(aiordma.ResourceClosedError):
        await kept


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_cancelled_receive_leaves_the_message_queued(lab: Lab) -> None:
    async with channel_to(lab, echo) as channel:
        data = _payload(3, 4 << 20)
        await channel.send_message(data[:10])  # something small first, so timing varies
        assert await asyncio.wait_for(channel.recv_message(), 30) == data[:10]
        sending = asyncio.create_task(channel.send_message(data))
        try:
            early = await asyncio.wait_for(channel.recv_message(), 0.01)
        except TimeoutError:
            early = None
        reply = early if early is not None else await asyncio.wait_for(channel.recv_message(), 30)
        await sending
        assert reply == data


@pytest.mark.parametrize(
    "garbage",
    [
        b"certainly not a packet header, but long enough to be taken for one",
        Header(Kind.CREDIT, credits=1000).pack(),
        Header(Kind.DONE, 0, msg_id=77).pack(),
    ],
    ids=["garbage", "too-many-credits", "unknown-done"],
)
@pytest.mark.asyncio
async def test_malformed_packet_closes_only_that_connection(
    lab: Lab, garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[BaseException] = []
    handlers: list[aiordma.Connection] = []
    both = asyncio.Event()

    async def serve(conn: aiordma.Connection) -> None:
        handlers.append(conn)
        if len(handlers) == 2:
            both.set()
        channel: MessageChannel = conn.prepared
        try:
            async for message in channel:
                await channel.send_message(message)
        except ProtocolError as exc:
            errors.append(exc)

    caplog.set_level(logging.WARNING, "aiordma.channel.channel")
    async with await aiordma.start_server(serve, lab.addr, 0, prepare=prepare_channel) as server:
        port = server.addresses[0][1]
        async with await aiordma.connect(lab.addr, port, prepare=prepare_channel) as good:
            channel: MessageChannel = good.prepared
            async with await aiordma.connect(lab.addr, port) as bad:
                # Once the server handed it over (else the packet may beat the
                # connection's ESTABLISHED event: see the next test).
                await asyncio.wait_for(both.wait(), 30)
                packet = bad.alloc(len(garbage))
                packet.view()[:] = garbage
                await bad.post_send(packet)
                await asyncio.wait_for(bad.wait_closed(), 30)
            await channel.send_message(b"unaffected")
            assert await asyncio.wait_for(channel.recv_message(), 30) == b"unaffected"
    assert len(errors) == 1
    assert "broke the message protocol" in caplog.text


@pytest.mark.asyncio
async def test_a_bad_first_packet_ends_the_set_up_at_once(
    lab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    """A packet that breaks the protocol may arrive before the server saw the
    connection established: the channel closes the connection, and the
    server's set-up stops waiting for the ESTABLISHED that will never come
    (it used to wait out the handshake timeout, here a minute)."""
    caplog.set_level(logging.WARNING, "aiordma")
    garbage = b"certainly not a packet header, but long enough to be taken for one"
    server = await aiordma.start_server(
        lambda conn: None, lab.addr, 0, prepare=prepare_channel, handshake_timeout=60
    )
    try:
        for _ in range(3):
            async with await aiordma.connect(lab.addr, server.addresses[0][1]) as bad:
                packet = bad.alloc(len(garbage))
                packet.view()[:] = garbage
                await bad.post_send(packet)  # at once: it may beat ESTABLISHED
                await asyncio.wait_for(bad.wait_closed(), 30)
    finally:
        server.close()
        server.close_clients()
        await asyncio.wait_for(server.wait_closed(), 20)  # no set-up left waiting
    assert caplog.text.count("broke the message protocol") == 3
    assert "did not confirm the connection" not in caplog.text


@pytest.mark.asyncio
async def test_messages_that_arrived_before_the_peer_left_are_still_delivered(lab: Lab) -> None:
    async def say_goodbye(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        for word in (b"one", b"two", b"bye"):
            await channel.send_message(word)
        # returning closes the connection

    async with channel_to(lab, say_goodbye) as channel:
        await asyncio.wait_for(channel.conn.wait_closed(), 30)
        assert [await channel.recv_message() for _ in range(3)] == [b"one", b"two", b"bye"]
        with pytest.raises(aiordma.ConnectionLostError):
            await channel.recv_message()


# -- exposure: exactly the message's bytes, for as long as it needs ---------


async def _prober_read(remote: aiordma.RemoteBuffer, lab: Lab) -> bytes:
    """RDMA-read ``remote`` from a fresh queue pair in the protection domain of this
    process's shared device (where the channels of this test register memory)."""
    device = aiordma.Device.shared(lab.device)
    a, b = await aiordma.connect_loopback_pair(device)
    try:
        target = device.alloc(max(1, remote.length))
        try:
            async with asyncio.timeout(30):
                await a.rdma_read(target.segment(0, remote.length), remote)
            return bytes(target.view()[: remote.length])
        finally:
            target.close()
    finally:
        for qp in (a, b):
            qp.close()
            await qp.wait_closed()


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 10


@pytest.mark.asyncio
async def test_closed_channels_unmap_their_regions_without_a_garbage_collection(
    lab: Lab,
) -> None:
    # Issue 41: RSS climbed by each closed connection's regions until a
    # full collection, since the channel's views of them kept them mapped.
    # Here the collector is off: what a closed connection leaves must go by
    # reference counting alone. Each channel maps 640 KiB (two regions of
    # 40 buffers of 8 KiB); what Python objects a close leaves in reference
    # cycles is about 45 KiB a cycle, both sides together.
    cycles, per_cycle = 40, 200  # KiB; regions left mapped made it about 680

    async with await aiordma.start_channel_server(echo_messages, lab.addr, 0) as server:
        port = server.addresses[0][1]

        async def cycle() -> None:
            async with await aiordma.open_channel(lab.addr, port) as channel:
                await channel.send_message(bytes(100))
                assert await channel.recv_message() == bytes(100)

        for _ in range(3):  # the device, the loop's completion queue, lazy imports
            await cycle()
        gc.collect()
        gc.disable()
        try:
            before = _rss_kib()
            for _ in range(cycles):
                await cycle()
            grown = _rss_kib() - before
        finally:
            gc.enable()
    assert grown < cycles * per_cycle, f"RSS grew by {grown} KiB over {cycles} cycles"


@pytest.mark.asyncio
async def test_a_slice_of_a_readable_pool_exposes_only_its_bytes_and_only_until_done(
    lab: Lab,
) -> None:
    slot = 64 << 10
    seen: dict[str, object] = {}
    probed = asyncio.Event()

    async def receive(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        await probed.wait()  # the message stays exposed, unread, while it is probed
        seen["message"] = bytes(await channel.recv_message())
        await channel.send_message(b"ok")

    async with channel_to(lab, receive, medium_limit=0) as channel:  # rendezvous
        pool = channel.conn.alloc(4 * slot, Access.REMOTE_READ)
        for i in range(4):
            pool.view()[i * slot : (i + 1) * slot] = bytes([i + 1]) * slot
        exposed: list[aiordma.MemoryRegion | aiordma.MemoryWindow] = []
        told = asyncio.Event()

        def watch(key: aiordma.MemoryRegion | aiordma.MemoryWindow) -> None:
            exposed.append(key)
            told.set()

        channel.watch_exposures(watch)
        send = asyncio.ensure_future(channel.send_message(pool[slot : 2 * slot]))
        await asyncio.wait_for(told.wait(), 60)
        (key,) = exposed
        assert isinstance(key, aiordma.MemoryRegion)
        remote = key.remote()
        inside = await _prober_read(remote, lab)
        outside: dict[str, object] = {}
        for name, where in (
            ("before", aiordma.RemoteBuffer(remote.addr - 1, 1, remote.rkey)),
            ("after", aiordma.RemoteBuffer(remote.addr + remote.length, 1, remote.rkey)),
        ):
            try:
                outside[name] = await _prober_read(where, lab)
            except aiordma.RemoteAccessError as exc:
                outside[name] = exc
        probed.set()
        await asyncio.wait_for(send, 60)
        assert await asyncio.wait_for(channel.recv_message(), 60) == b"ok"
        # The advertised rkey is not the pool's, and covers the message alone.
        assert remote.rkey != pool.rkey
        assert (remote.addr, remote.length) == (pool.addr + slot, slot)
        assert inside == bytes([2]) * slot
        assert isinstance(outside["before"], aiordma.RemoteAccessError), outside["before"]
        assert isinstance(outside["after"], aiordma.RemoteAccessError), outside["after"]
        assert seen["message"] == bytes([2]) * slot
        # DONE ended the exposure: the same rkey is refused now.
        assert channel.exposed_bytes == 0
        with pytest.raises(aiordma.RemoteAccessError):
            await _prober_read(remote, lab)


def _recording_registrations(conn: aiordma.Connection) -> list[object]:
    """What ``conn.register`` is asked to register from now on (it still registers)."""
    registered: list[object] = []
    register = conn.register

    def recording_register(obj: object, *args: Access) -> aiordma.MemoryRegion:
        registered.append(obj)
        return register(obj, *args)

    conn.register = recording_register  # type: ignore[assignment,method-assign]
    return registered


@pytest.mark.asyncio
async def test_bindable_memory_is_exposed_through_a_window_until_done(lab: Lab) -> None:
    """A region registered with MW_BIND is exposed through a memory window on
    the channel's queue pair: nothing is registered, the rkey is not the
    region's, the region itself stays closed to peers, and after DONE the
    rkey is refused even on the very connection it was given to."""
    size = 256 << 10
    seen: dict[str, object] = {}
    reread = asyncio.Event()

    async def receive(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        seen["message"] = bytes(await channel.recv_message())
        await channel.send_message(b"ok")
        await reread.wait()
        remote = seen["remote"]
        assert isinstance(remote, aiordma.RemoteBuffer)
        try:
            await asyncio.wait_for(conn.rdma_read(conn.alloc(size), remote), 30)
            seen["after"] = "read"
        except aiordma.RdmaError as exc:
            seen["after"] = exc

    async with channel_to(lab, receive, medium_limit=0) as channel:  # rendezvous
        conn = channel.conn
        region = conn.alloc(size, Access.LOCAL_WRITE | Access.MW_BIND)
        region.view()[:] = _payload(5, size)
        registered = _recording_registrations(conn)

        def record(key: aiordma.MemoryRegion | aiordma.MemoryWindow) -> None:
            assert isinstance(key, aiordma.MemoryWindow)
            seen["remote"] = key.remote  # what the peer is given

        channel.watch_exposures(record)
        await asyncio.wait_for(channel.send_message(region), 60)
        assert await asyncio.wait_for(channel.recv_message(), 60) == b"ok"
        assert seen["message"] == _payload(5, size)
        remote = seen["remote"]
        assert isinstance(remote, aiordma.RemoteBuffer)
        assert (remote.addr, remote.length) == (region.addr, size)
        assert remote.rkey != region.rkey
        assert registered == []  # a window, not a registration
        ring = channel._records.window if channel._records is not None else None
        assert conn.qp._windows <= {ring}  # the message's revoked at DONE; the ring's stays
        reread.set()
        await asyncio.wait_for(channel.conn.wait_closed(), 30)  # the failed read broke it
    assert isinstance(seen["after"], aiordma.RemoteAccessError), seen["after"]


async def _take_withdrawn_then_next(
    channel: MessageChannel, announced: asyncio.Event, got: list[object]
) -> None:
    """The receiver of a large send its sender withdraws, then of a small
    message after it: say when the large one is announced, wait until the
    small one arrived (so the REVOKE sent before it did), then take both
    (the outcome of each goes to ``got``)."""
    await channel.wait_message()  # the large message is announced, not yet read
    announced.set()
    while channel._inbox.queued() < 2:
        await channel._changed()
    try:
        got.append(await channel.recv_message())
    except aiordma.MessageRevokedError as exc:
        got.append(exc)
    got.append(bytes(await channel.recv_message()))


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_a_cancelled_send_revokes_its_window(lab: Lab) -> None:
    size = 256 << 10
    announced, finished, probe = asyncio.Event(), asyncio.Event(), asyncio.Event()
    got: list[object] = []
    shared: dict[str, aiordma.RemoteBuffer] = {}

    async def slow(conn: aiordma.Connection) -> None:
        await _take_withdrawn_then_next(conn.prepared, announced, got)
        finished.set()
        await probe.wait()
        try:  # through the very connection the rkey was given to
            await asyncio.wait_for(conn.rdma_read(conn.alloc(size), shared["remote"]), 30)
            got.append("read")
        except aiordma.RdmaError as exc:
            got.append(exc)

    async with channel_to(lab, slow, medium_limit=0) as channel:  # rendezvous
        region = channel.conn.alloc(size, Access.LOCAL_WRITE | Access.MW_BIND)
        exposed: list[object] = []
        channel.watch_exposures(exposed.append)
        send = asyncio.ensure_future(channel.send_message(region))
        await asyncio.wait_for(announced.wait(), 60)
        (window,) = exposed
        assert isinstance(window, aiordma.MemoryWindow)
        assert window.valid
        send.cancel()
        with pytest.raises(asyncio.CancelledError):
            await send
        await exposures_ended(channel)  # the peer answered the REVOKE
        assert not window.valid
        await channel.send_message(b"next")
        await asyncio.wait_for(finished.wait(), 60)
        shared["remote"] = window.remote
        probe.set()
        await asyncio.wait_for(channel.conn.wait_closed(), 30)  # the refused read broke it
    assert isinstance(got[0], aiordma.MessageRevokedError)
    assert got[1] == b"next"
    assert isinstance(got[2], aiordma.RemoteAccessError), got[2]


@pytest.mark.asyncio
@pytest.mark.parametrize("whole", [True, False], ids=["region", "segment"])
async def test_registered_memory_up_to_the_medium_limit_is_copied_not_exposed(
    lab: Lab, whole: bool
) -> None:
    """Registered for speed, a 64 KiB body takes the faster way, in pieces:
    nothing is exposed or registered for it, and it may be reused as soon
    as the send returns."""
    size = 64 << 10
    async with channel_to(lab, echo) as channel:
        conn = channel.conn
        region = conn.alloc(2 * size, Access.LOCAL_WRITE | Access.MW_BIND)
        body = region[:size] if not whole else region
        length = len(body)
        region.view()[:length] = _payload(7, length)
        exposed: list[object] = []
        channel.watch_exposures(exposed.append)
        registered = _recording_registrations(conn)
        await asyncio.wait_for(channel.send_message(body), 60)
        region.view()[:] = bytes(2 * size)  # what went was copied
        assert await asyncio.wait_for(channel.recv_message(), 60) == _payload(7, length)
        assert exposed == []
        assert registered == []
        assert region.inflight == 0


@pytest.mark.asyncio
async def test_a_slice_of_bindable_memory_uses_a_window_only_where_windows_are_bounded(
    lab: Lab,
) -> None:
    """On rxe a window's rkey reaches its whole region, so a slice of a
    bindable region is registered on its own instead."""
    size = 128 << 10
    async with channel_to(lab, echo, medium_limit=0) as channel:  # rendezvous
        conn = channel.conn
        pool = conn.alloc(2 * size, Access.LOCAL_WRITE | Access.MW_BIND)
        pool.view()[size:] = _payload(6, size)
        registered = _recording_registrations(conn)
        await asyncio.wait_for(channel.send_message(pool[size:]), 60)
        assert await asyncio.wait_for(channel.recv_message(), 60) == _payload(6, size)
        windows_used = not any(isinstance(obj, memoryview) and len(obj) == size
                               for obj in registered)  # fmt: skip
        assert windows_used == conn.device.attributes.bounded_windows


@pytest.mark.asyncio
async def test_unread_large_messages_are_bounded_then_revoked_on_both_sides(lab: Lab) -> None:
    size, bound = 64 << 10, 3 * (64 << 10)
    peak: list[int] = []
    gate = asyncio.Event()
    outcome: list[object] = []

    async def never_reads_until_told(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        await gate.wait()
        for _ in range(5):
            try:
                outcome.append(await channel.recv_message())
            except aiordma.MessageRevokedError as exc:
                outcome.append(exc)
        await channel.send_message(b"after")

    prepare = channel_factory(  # medium_limit=0: these go by rendezvous, not by copy
        max_exposed=bound, max_message=bound, exposure_timeout=1.0, medium_limit=0
    )
    async with await aiordma.start_server(
        never_reads_until_told, lab.addr, 0, prepare=prepare
    ) as server:
        port = server.addresses[0][1]
        async with await aiordma.connect(lab.addr, port, prepare=prepare) as conn:
            channel: MessageChannel = conn.prepared
            channel.watch_exposures(lambda _: peak.append(channel.exposed_bytes))
            before = rdma_counts(lab.device)["mr"]
            sends = [channel.send_message(bytes([i]) * size) for i in range(5)]
            results = await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 60)
            assert all(isinstance(r, aiordma.ExposureTimeoutError) for r in results), results
            assert len(peak) == 5
            assert max(peak) <= bound
            assert channel.exposed_bytes == 0
            assert rdma_counts(lab.device)["mr"] == before - 0  # nothing left registered
            gate.set()
            assert await asyncio.wait_for(channel.recv_message(), 60) == b"after"
    assert len(outcome) == 5
    assert all(isinstance(o, aiordma.MessageRevokedError) for o in outcome), outcome


@pytest.mark.asyncio
@pytest.mark.both_loops("cancellation")
async def test_cancelling_a_large_send_revokes_it(lab: Lab) -> None:
    announced, finished = asyncio.Event(), asyncio.Event()
    got: list[object] = []

    async def slow(conn: aiordma.Connection) -> None:
        await _take_withdrawn_then_next(conn.prepared, announced, got)
        finished.set()

    async with channel_to(lab, slow, medium_limit=0) as channel:  # by rendezvous
        send = asyncio.ensure_future(channel.send_message(bytes(100_000)))
        await asyncio.wait_for(announced.wait(), 60)
        assert channel.exposed_bytes == 100_000
        send.cancel()
        with pytest.raises(asyncio.CancelledError):
            await send
        await exposures_ended(channel)  # the peer answered the REVOKE
        await channel.send_message(b"next")
        await asyncio.wait_for(finished.wait(), 60)
    assert isinstance(got[0], aiordma.MessageRevokedError)
    assert got[1] == b"next"


@pytest.mark.asyncio
async def test_a_message_larger_than_the_peers_limit_fails_on_the_sender(lab: Lab) -> None:
    async def serve(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        async for message in channel:
            await channel.send_message(message)

    server_prepare = channel_factory(max_message=100_000)
    async with await aiordma.start_server(serve, lab.addr, 0, prepare=server_prepare) as server:
        port = server.addresses[0][1]
        channel = await aiordma.open_channel(lab.addr, port, max_message=1 << 20)
        async with channel:
            with pytest.raises(aiordma.MessageTooLargeError, match="peer's max_message of 100000"):
                await asyncio.wait_for(channel.send_message(bytes(200_000)), 60)
            assert channel.peer_max_message == 100_000
            # Nothing was sent: the connection still works.
            await channel.send_message(b"still fine")
            assert await asyncio.wait_for(channel.recv_message(), 60) == b"still fine"


# -- loops, hooks, shapes ----------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.both_loops("close")
async def test_receiving_from_another_event_loop_raises_instead_of_hanging(lab: Lab) -> None:
    async with channel_to(lab, echo) as channel:

        def elsewhere() -> None:
            async def attempt() -> None:
                await asyncio.wait_for(channel.recv_message(), 5)

            asyncio.run(attempt())

        with pytest.raises(aiordma.WrongLoopError):
            await asyncio.to_thread(elsewhere)
        await channel.send_message(b"here")
        assert await asyncio.wait_for(channel.recv_message(), 60) == b"here"


@pytest.mark.asyncio
async def test_open_channel_and_start_channel_server_hand_out_channels(lab: Lab) -> None:
    async def shout(channel: MessageChannel) -> None:
        async for message in channel:
            await channel.send_message(bytes(message).upper())

    async with await aiordma.start_channel_server(shout, lab.addr, 0) as server:
        port = server.addresses[0][1]
        async with await aiordma.open_channel(lab.addr, port) as channel:
            assert isinstance(channel, MessageChannel)
            await channel.send_message(b"hi")
            assert await asyncio.wait_for(channel.recv_message(), 60) == b"HI"
        assert channel.conn.closed


@pytest.mark.asyncio
@pytest.mark.both_loops("completion fd")
async def test_messages_flow_when_the_completion_queues_poll(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With AIORDMA_POLL_US each CQ polls for a while after work is posted,
    and the packet lane kicks it after every send (without, it does not
    call the CQ at all): messages of every path still flow."""
    monkeypatch.setenv("AIORDMA_POLL_US", "300")  # read as each CQ is made

    async def echo_all(channel: MessageChannel) -> None:
        async for message in channel:
            await channel.send_message(message)

    async with await aiordma.start_channel_server(echo_all, lab.addr, 0) as server:
        port = server.addresses[0][1]
        async with await aiordma.open_channel(lab.addr, port) as channel:
            for size in (1, 5000, 100_000):  # eager, eager, medium
                body = _payload(size, size)
                await channel.send_message(body)
                assert await asyncio.wait_for(channel.recv_message(), 60) == body


@pytest.mark.asyncio
async def test_a_forgotten_channel_on_one_side_is_named_on_both(lab: Lab) -> None:
    failure: list[BaseException] = []

    async def serve(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        try:
            await asyncio.wait_for(channel.recv_message(), 60)
        except aiordma.CompletionError as exc:
            failure.append(exc)

    async with await aiordma.start_server(serve, lab.addr, 0, prepare=prepare_channel) as server:
        port = server.addresses[0][1]
        async with await aiordma.connect(lab.addr, port) as conn:  # no prepare: no channel
            with pytest.raises(aiordma.NotPreparedError, match="no prepare hook"):
                conn.prepared  # noqa: B018
            await asyncio.wait_for(conn.wait_closed(), 60)  # the server gives up on us
    assert len(failure) == 1
    assert "did both sides set up a message channel" in str(failure[0])


@pytest.mark.asyncio
async def test_receive_into_checks_the_buffer_before_waiting(lab: Lab) -> None:
    async with channel_to(lab, echo) as channel:
        with pytest.raises(TypeError, match="read-only"):
            await channel.recv_message_into(b"immutable")
        with pytest.raises(TypeError, match="str"):
            await channel.recv_message_into("text")  # type: ignore[arg-type]
        closed = channel.conn.alloc(64)
        closed.close()
        with pytest.raises(ValueError, match="closed"):
            await channel.recv_message_into(closed)
        with pytest.raises(ValueError, match="LOCAL_WRITE"):
            await channel.recv_message_into(channel.conn.register(bytearray(64), Access.NONE))
        await channel.send_message(b"x" * 100)
        with pytest.raises(BufferTooSmallError) as info:
            await asyncio.wait_for(channel.recv_message_into(bytearray(10)), 60)
        assert (info.value.needed, info.value.given) == (100, 10)


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [100, 20_000, 1 << 20], ids=["eager", "medium", "rendezvous"])
async def test_a_numpy_array_is_received_into_like_any_writable_buffer(lab: Lab, size: int) -> None:
    """Issue 62: ``recv_message_into(array)`` was refused, though
    ``recv_message_into(memoryview(array))`` worked."""
    import numpy as np

    async with channel_to(lab, echo) as channel:
        sent = np.arange(size // 4, dtype=np.uint32)
        # (numpy's stubs make an array a Buffer from Python 3.12 on)
        await channel.send_message(sent)  # type: ignore[arg-type]
        landed = np.zeros(size // 4, dtype=np.uint32)
        received = channel.recv_message_into(landed)  # type: ignore[arg-type]
        assert await asyncio.wait_for(received, 60) == size
        assert np.array_equal(landed, sent)


@pytest.mark.asyncio
async def test_python_objects_are_refused_before_anything_is_sent(lab: Lab) -> None:
    """Issue 62: an object array was sent as this process's addresses."""
    import numpy as np

    objects = np.array([object(), "secret"], dtype=object)
    async with channel_to(lab, echo) as channel:
        sent_before = channel.stats()["counters"].get("messages_sent", 0)
        with pytest.raises(TypeError, match="holds Python objects"):
            await channel.send_message(objects)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="holds Python objects"):
            await channel.send_message(memoryview(objects))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="holds Python objects"):
            await channel.send_messages([b"fine", np.zeros(3, dtype=object)])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="holds Python objects"):
            await channel.recv_message_into(np.zeros(4, dtype=object))  # type: ignore[arg-type]
        assert channel.stats()["counters"].get("messages_sent", 0) == sent_before  # not one
        await channel.send_message(b"still usable")
        assert await asyncio.wait_for(channel.recv_message(), 60) == b"still usable"


class _PairLink:
    """A :class:`~aiordma.channel.link.Link` made of a queue pair connected by
    hand: the channel needs no rdma_cm connection."""

    def __init__(self, qp: aiordma.QueuePair) -> None:
        self._qp = qp
        self._regions: list[aiordma.MemoryRegion] = []
        self._ready: list[Callable[[], None]] = []
        self.stats_parts: list[Stats] = []

    @property
    def qp(self) -> aiordma.QueuePair:
        return self._qp

    @property
    def device(self) -> aiordma.Device:
        device = self._qp.device
        assert isinstance(device, aiordma.Device)
        return device

    @property
    def loopback(self) -> bool:
        return True  # both queue pairs are on one device

    def register(self, obj: object, access: Access | None = None) -> aiordma.MemoryRegion:
        region = self._qp.device.register(obj, access)
        self._regions.append(region)
        return region

    def alloc(self, size: int, access: Access = Access.LOCAL_WRITE) -> aiordma.MemoryRegion:
        region = self._qp.device.alloc(size, access)
        self._regions.append(region)
        return region

    def established(self) -> None:
        for callback in self._ready:
            callback()

    def on_established(self, callback: Callable[[], None]) -> None:
        self._ready.append(callback)

    def add_stats(self, stats: Stats) -> None:
        self.stats_parts.append(stats)

    def is_closing(self) -> bool:
        return self._qp.is_closing()

    def close(self) -> Awaitable[None]:
        self._qp.close()
        return asyncio.ensure_future(self.wait_closed())

    async def wait_closed(self) -> None:
        await self._qp.wait_closed()
        for region in self._regions:
            await region.aclose()


@pytest.mark.asyncio
async def test_heads_travel_with_bodies_on_any_link(device: aiordma.Device) -> None:
    a, b = await aiordma.connect_loopback_pair(device)
    links = _PairLink(a), _PairLink(b)
    left, right = [await prepare_channel(link) for link in links]
    for link in links:
        link.established()
    with pytest.raises(TypeError, match="not on a Connection"):
        _ = left.conn
    big = _payload(1, 50_000)  # rendezvous: the head travels in the announcement
    await left.send_message(b"small", head=b"h1")
    sending = asyncio.ensure_future(left.send_message(big, head=b"h2"))
    await asyncio.wait_for(right.wait_message(), 30)
    assert await right.recv_message_with_head() == (b"h1", b"small")
    seen: list[tuple[bytes, int]] = []
    landing = bytearray(60_000)

    def choose(head: bytes, length: int) -> bytearray:
        seen.append((head, length))
        return landing

    head, n = await asyncio.wait_for(right.recv_message_with_head(choose), 30)
    assert isinstance(n, int)
    await asyncio.wait_for(sending, 30)
    assert (head, n, seen) == (b"h2", len(big), [(b"h2", len(big))])
    assert bytes(landing[:n]) == big
    with pytest.raises(TypeError, match="head must be bytes"):
        await left.send_message(b"x", head="text")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="head of"):
        await left.send_message(b"x", head=bytes(left.eager_limit + 1))
    for channel in (left, right):
        await channel.close()


@pytest.mark.asyncio
@pytest.mark.both_loops("close")
async def test_a_failed_channel_is_closing(device: aiordma.Device) -> None:
    a, b = await aiordma.connect_loopback_pair(device)
    links = _PairLink(a), _PairLink(b)
    left, right = [await prepare_channel(link) for link in links]
    for link in links:
        link.established()
    await left.send_message(b"hello")
    assert await asyncio.wait_for(right.recv_message(), 30) == b"hello"
    await right.close()  # its queue pair is gone: the left one's next send fails
    assert not left.is_closing()
    await left.send_message(b"into the void")
    with pytest.raises((aiordma.RdmaError, ConnectionError)):
        await asyncio.wait_for(left.recv_message(), 30)
    assert not links[0].is_closing()  # the link itself was not closed...
    assert left.is_closing()  # ...but the channel failed: it is closing
    await left.close()


@pytest.mark.asyncio
async def test_closed_channels_are_freed_on_both_sides_without_the_collector(lab: Lab) -> None:
    """Issue 50: a closed connection's unsignalled sends left their ids in the
    device's completion queue, which kept every closed channel, its
    connection and their buffers alive for as long as the device lived; and
    reference cycles between a closed channel, its connection and their
    parts left the rest to the collector. Reference counting frees them now."""
    refs: list[weakref.ref[object]] = []
    served: list[MessageChannel] = []

    async def echo(channel: MessageChannel) -> None:
        served.append(channel)
        async for message in channel:
            await channel.send_message(message)

    server = await aiordma.start_channel_server(echo, lab.addr, 0)
    gc.collect()
    gc.disable()
    try:
        port = server.addresses[0][1]
        for _ in range(5):
            async with await aiordma.open_channel(lab.addr, port) as channel:
                refs += [weakref.ref(channel), weakref.ref(channel.link)]
                for size in (100, 3000, 200_000):  # eager, medium, rendezvous
                    await channel.send_message(bytes(size))
                    assert len(await asyncio.wait_for(channel.recv_message(), 30)) == size
            del channel
        assert len(served) == 5
        for channel in served:
            refs += [weakref.ref(channel), weakref.ref(channel.link)]
            await asyncio.wait_for(channel.wait_closed(), 30)
        del channel
        served.clear()
        alive = [ref() for ref in refs if ref() is not None]
        assert not alive, f"{len(alive)} of {len(refs)} closed channels and connections live on"
    finally:
        gc.enable()
        server.close()
        await server.wait_closed()
