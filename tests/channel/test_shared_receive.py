"""Message channels drawing their receive buffers from one shared receive queue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

import aiordma
from aiordma import MessageChannel, SharedReceiveQueue, metrics, rpc
from aiordma.channel.credits import SharedDataCredits
from aiordma.exceptions import ConnectionLostError
from tests.channel.test_channel import _payload, _rnr_counters
from tests.conftest import Lab, echo_messages

pytestmark = pytest.mark.rdma


@asynccontextmanager
async def pool_server(
    lab: Lab, handler: Callable[[MessageChannel], Awaitable[None]] = echo_messages, **pool: int
) -> AsyncIterator[tuple[SharedReceiveQueue, int, list[MessageChannel]]]:
    """A channel server whose clients' channels share one pool; yields it,
    the port, and the server's side of each channel as it is served."""
    served: list[MessageChannel] = []

    async def serve(channel: MessageChannel) -> None:
        served.append(channel)
        await handler(channel)

    async with (
        SharedReceiveQueue(None, **pool) as srq,
        await aiordma.start_channel_server(serve, lab.addr, 0, shared_receive=srq) as server,
    ):
        yield srq, server.addresses[0][1], served


def _credits(channel: MessageChannel) -> SharedDataCredits:
    data = channel._data_credits
    assert isinstance(data, SharedDataCredits)
    return data


@pytest.mark.asyncio
async def test_many_clients_exchange_messages_through_one_pool(lab: Lab) -> None:
    clients, rounds = 24, 5
    async with pool_server(lab, buffers=512) as (srq, port, served):
        channels = await asyncio.gather(
            *(aiordma.open_channel(lab.addr, port) for _ in range(clients))
        )
        assert srq.stats()["gauges"]["channels"] == clients
        exported = [stats for labels, stats in metrics.collect() if labels.get("pool")]
        assert [s.gauges()["channels"] for s in exported] == [clients]
        # Each channel owns its base and control buffers, at least.
        assert srq.stats()["gauges"]["free"] <= 512 - clients * (srq.base_credits + 4)

        async def talk(i: int, channel: MessageChannel) -> list[bytes]:
            got = []
            for r in range(rounds):
                await channel.send_message(_payload(i * 100 + r, 100 + 700 * r))
                got.append(bytes(await channel.recv_message()))
            return got

        replies = await asyncio.wait_for(
            asyncio.gather(*(talk(i, c) for i, c in enumerate(channels))), 120
        )
        for i, got in enumerate(replies):
            assert got == [_payload(i * 100 + r, 100 + 700 * r) for r in range(rounds)]
        for channel in channels:
            await channel.close()
        for channel in served:
            await asyncio.wait_for(channel.wait_closed(), 30)
        assert srq.stats()["gauges"]["channels"] == 0
        assert srq.credits.free == srq.buffers  # every buffer came back


@pytest.mark.asyncio
async def test_large_messages_and_both_sides_on_pools(lab: Lab) -> None:
    sizes = [0, 8000, 8153, 70_000, 1 << 20]
    async with (
        pool_server(lab, buffers=64) as (_, port, _served),
        SharedReceiveQueue(buffers=64) as client_pool,
        await aiordma.open_channel(lab.addr, port, shared_receive=client_pool) as channel,
    ):
        for i, size in enumerate(sizes):
            await channel.send_message(_payload(i, size))
            assert await asyncio.wait_for(channel.recv_message(), 30) == _payload(i, size)
        assert channel.conn.qp.shared_receive is client_pool


@pytest.mark.asyncio
async def test_a_busy_peer_borrows_buffers_beyond_its_base(lab: Lab) -> None:
    count = 300
    most = 0
    all_in = asyncio.Event()

    async def sink(channel: MessageChannel) -> None:
        nonlocal most
        for _ in range(count):
            await channel.recv_message()
            most = max(most, _credits(channel).tokens)
        all_in.set()

    async with (
        pool_server(lab, sink, buffers=256) as (srq, port, _),
        await aiordma.open_channel(lab.addr, port) as channel,
    ):
        for i in range(count):
            await channel.send_message(b"%d" % i)
        await asyncio.wait_for(all_in.wait(), 60)
    assert most > srq.base_credits  # it borrowed while its peer kept up the pace


@pytest.mark.asyncio
async def test_a_slow_reader_on_a_pool_holds_its_sender_back_without_rnr(lab: Lab) -> None:
    count = 60
    consumed = 0
    received: list[bytes] = []
    finished = asyncio.Event()

    async def slow(channel: MessageChannel) -> None:
        nonlocal consumed
        for _ in range(count):
            received.append(bytes(await channel.recv_message()))
            consumed += 1
            await asyncio.sleep(0.005)  # the receiver's "work"
        finished.set()

    before = _rnr_counters(lab.device)
    # A pool small enough that the slow reader's sender could overrun it
    # many times over if credits did not hold it back.
    async with (
        pool_server(lab, slow, buffers=16) as (srq, port, _),
        await aiordma.open_channel(lab.addr, port) as channel,
    ):
        for i in range(count):
            await channel.send_message(b"%d" % i)
        consumed_when_sender_done = consumed
        await asyncio.wait_for(finished.wait(), 60)
        assert channel.stats()["counters"]["credit_stalls"] > 0
    assert received == [b"%d" % i for i in range(count)]
    assert consumed_when_sender_done >= count - srq.buffers
    assert _rnr_counters(lab.device) == before


@pytest.mark.asyncio
async def test_a_full_pool_refuses_the_next_client_and_keeps_serving(lab: Lab) -> None:
    # Room for exactly two channels (base 2 + control 4 each).
    async with pool_server(lab, buffers=12) as (srq, port, served):
        first = await aiordma.open_channel(lab.addr, port)
        second = await aiordma.open_channel(lab.addr, port)
        with pytest.raises(ConnectionRefusedError):
            await aiordma.open_channel(lab.addr, port)
        assert srq.stats()["counters"]["refused"] == 1
        for channel in (first, second):
            await channel.send_message(b"still here")
            assert await asyncio.wait_for(channel.recv_message(), 30) == b"still here"
        await first.close()
        await asyncio.wait_for(served[0].wait_closed(), 30)
        assert srq.stats()["gauges"]["channels"] == 1
        third = await aiordma.open_channel(lab.addr, port)  # its room came back
        await third.send_message(b"hi")
        assert await asyncio.wait_for(third.recv_message(), 30) == b"hi"
        await third.close()
        await second.close()


@pytest.mark.asyncio
async def test_a_peer_that_leaves_fails_the_pending_receive_promptly(lab: Lab) -> None:
    failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    async def wait_forever(channel: MessageChannel) -> None:
        try:
            await channel.recv_message()
        except BaseException as exc:
            failed.set_result(exc)
            raise

    async with pool_server(lab, wait_forever, buffers=32) as (_, port, _served):
        channel = await aiordma.open_channel(lab.addr, port)
        await channel.close()
        error = await asyncio.wait_for(failed, 10)
        assert isinstance(error, ConnectionLostError | aiordma.ResourceClosedError)


@pytest.mark.asyncio
async def test_a_queue_pair_on_a_pool_refuses_receives_of_its_own(lab: Lab) -> None:
    async with (
        aiordma.Device(lab.device) as device,
        SharedReceiveQueue(device, buffers=16) as srq,
    ):
        qp = device.create_qp(shared_receive=srq)
        try:
            segment = device.alloc(64)[:]
            with pytest.raises(ValueError, match="shared receive queue"):
                await qp.post_recv(segment)
            segment.mr.close()
        finally:
            qp.destroy()


@pytest.mark.asyncio
async def test_a_pool_of_another_device_object_says_what_differs(lab: Lab) -> None:
    """Issue 62: this said "is on <Device rxe0>, not <Device rxe0>"."""
    async with (
        aiordma.Device(lab.device) as mine,
        aiordma.Device(lab.device) as other,
        SharedReceiveQueue(other, buffers=16) as srq,
    ):
        says = f"another Device object for {lab.device}: each Device has its own protection"
        with pytest.raises(ValueError, match=says):
            mine.create_qp(shared_receive=srq)
        with pytest.raises(ValueError, match=says):
            aiordma.ConnectOptions(device=mine, shared_receive=srq)


@pytest.mark.asyncio
async def test_pool_arguments_are_checked(lab: Lab) -> None:
    async with aiordma.Device(lab.device) as device:
        with pytest.raises(ValueError, match="buffers must be between"):
            SharedReceiveQueue(device, buffers=3)
        with pytest.raises(ValueError, match="buffer_size"):
            SharedReceiveQueue(device, buffer_size=40)
        async with SharedReceiveQueue(device, buffers=16) as srq:
            with pytest.raises(ValueError, match="buffer_size"):
                await aiordma.start_channel_server(
                    echo_messages, lab.addr, 0, shared_receive=srq, buffer_size=4096
                )
        assert srq.closed


@pytest.mark.asyncio
async def test_an_rpc_server_on_a_pool(lab: Lab) -> None:
    service = rpc.Service()

    @service.method()
    async def double(data: bytes) -> bytes:
        return data * 2

    async with (
        SharedReceiveQueue(None, buffers=128) as srq,
        await rpc.start_server(service, lab.addr, 0, shared_receive=srq) as server,
    ):
        port = server.addresses[0][1]
        clients = [await rpc.connect(lab.addr, port) for _ in range(6)]
        replies = await asyncio.wait_for(
            asyncio.gather(*(c.call("double", b"%d" % i) for i, c in enumerate(clients))), 60
        )
        assert replies == [b"%d" % i * 2 for i in range(6)]
        assert srq.stats()["gauges"]["channels"] == 6
        for client in clients:
            await client.close()


@pytest.mark.asyncio
@pytest.mark.both_loops("close")
async def test_closing_a_pool_ends_the_connections_still_on_it(lab: Lab) -> None:
    async with pool_server(lab, buffers=32) as (_, port, _served):
        client_pool = SharedReceiveQueue(None, buffers=32)
        channel = await aiordma.open_channel(lab.addr, port, shared_receive=client_pool)
        await channel.send_message(b"x")
        assert await asyncio.wait_for(channel.recv_message(), 30) == b"x"
        pending = asyncio.ensure_future(channel.recv_message())
        await asyncio.wait_for(client_pool.aclose(), 30)
        assert client_pool.closed
        with pytest.raises((ConnectionLostError, aiordma.ResourceClosedError)):
            await asyncio.wait_for(pending, 10)
        await channel.close()
