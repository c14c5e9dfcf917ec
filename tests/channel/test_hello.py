"""What each channel's HELLO settles (lab device, asyncio and uvloop): that the
server holds the connection when the client is told it is connected, each
side's receive buffer size, and the protocol both sides speak."""

from __future__ import annotations

import asyncio
import logging

import pytest

import aiordma
from aiordma import rpc, streams
from tests.channel.test_channel import _payload
from tests.conftest import Lab, echo_messages

SERVER_PATIENCE = 2.0
"""The servers' handshake_timeout in these tests."""
SLOW_CLIENT = 2.5 * SERVER_PATIENCE
"""Seconds a slow client's prepare hook takes, between the server's accept
and the client's confirmation: the server gives the set-up up meanwhile."""


async def slow_prepare(conn: aiordma.Connection) -> None:
    await asyncio.sleep(SLOW_CLIENT)  # the client's load being simulated


async def open_and_close(host: str, port: int) -> None:
    channel = await aiordma.open_channel(host, port, prepare=slow_prepare)
    await channel.close()  # reached only by the defect: a "connected" dead channel


@pytest.mark.asyncio
async def test_a_client_the_server_gave_up_on_is_never_told_it_is_connected(
    lab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="aiordma.cm")
    async with await aiordma.start_channel_server(
        echo_messages, lab.addr, 0, handshake_timeout=SERVER_PATIENCE
    ) as server:
        port = server.addresses[0][1]
        async with asyncio.timeout(30):
            with pytest.raises((ConnectionError, TimeoutError)):
                await open_and_close(lab.addr, port)
        assert not server.connections
    # Silent past the deadline, as a client that gave up and whose reject was
    # lost would be: the client's business, an INFO line, not a warning.
    (line,) = [r for r in caplog.records if "did not confirm the connection" in r.getMessage()]
    assert line.levelno == logging.INFO
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.asyncio
async def test_concurrent_clients_either_work_or_get_a_typed_error(lab: Lab) -> None:
    """Half the clients are too slow for the server's set-up timeout: each of
    those fails in connect; each client that connects has a working channel."""
    async with await aiordma.start_channel_server(
        echo_messages, lab.addr, 0, handshake_timeout=SERVER_PATIENCE
    ) as server:
        port = server.addresses[0][1]

        async def client(i: int) -> str:
            slow = i % 2 == 1
            try:
                channel = await aiordma.open_channel(
                    lab.addr, port, prepare=slow_prepare if slow else None
                )
            except (ConnectionError, TimeoutError):
                return "refused"
            async with channel:
                await channel.send_message(_payload(i, 100))
                assert await asyncio.wait_for(channel.recv_message(), 30) == _payload(i, 100)
            return "worked"

        async with asyncio.timeout(60):
            outcomes = await asyncio.gather(*(client(i) for i in range(8)))
    assert [outcomes[i] for i in range(1, 8, 2)] == ["refused"] * 4, outcomes


@pytest.mark.asyncio
@pytest.mark.parametrize(("client_size", "server_size"), [(8192, 1024), (1024, 8192)])
async def test_sides_with_different_buffer_sizes_exchange_every_size(
    lab: Lab, client_size: int, server_size: int
) -> None:
    sizes = [0, 100, 900, 1000, 1024, 3000, 8000, 8192, 20_000, 100_000]
    async with await aiordma.start_channel_server(
        echo_messages, lab.addr, 0, buffer_size=server_size
    ) as server:
        port = server.addresses[0][1]
        async with await aiordma.open_channel(lab.addr, port, buffer_size=client_size) as channel:
            assert channel.eager_limit == min(client_size, server_size) - 40
            for i, size in enumerate(sizes):
                await channel.send_message(_payload(i, size))
                echoed = await asyncio.wait_for(channel.recv_message(), 30)
                assert echoed == _payload(i, size), size


@pytest.mark.asyncio
async def test_a_default_client_of_a_pool_with_smaller_buffers(lab: Lab) -> None:
    async with (
        aiordma.SharedReceiveQueue(buffers=64, buffer_size=4096) as pool,
        await aiordma.start_channel_server(
            echo_messages, lab.addr, 0, shared_receive=pool
        ) as server,
        await aiordma.open_channel(lab.addr, server.addresses[0][1]) as channel,
    ):
        for i, size in enumerate([4000, 4056, 4057, 6000, 8000, 8152]):
            await channel.send_message(_payload(i, size))
            echoed = await asyncio.wait_for(channel.recv_message(), 30)
            assert echoed == _payload(i, size), size


@pytest.mark.asyncio
async def test_an_rpc_client_of_a_stream_server_fails_on_both_sides_naming_both(lab: Lab) -> None:
    ended: asyncio.Future[BaseException | bytes] = asyncio.get_running_loop().create_future()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ended.set_result(await reader.read())
        except Exception as exc:
            ended.set_result(exc)

    async with await streams.start_stream_server(serve, lab.addr, 0) as server:
        port = server.addresses[0][1]
        async with asyncio.timeout(30):
            with pytest.raises(aiordma.ProtocolMismatchError) as info:
                await rpc.connect(lab.addr, port)
            assert (info.value.ours, info.value.theirs) == ("aiordma.rpc", "aiordma.streams")
            assert "'aiordma.streams'" in str(info.value)
            on_server = await ended
    assert isinstance(on_server, aiordma.ProtocolMismatchError), on_server
    assert (on_server.ours, on_server.theirs) == ("aiordma.streams", "aiordma.rpc")


@pytest.mark.asyncio
async def test_a_stream_client_of_an_rpc_server_fails_naming_both(lab: Lab) -> None:
    async with await rpc.start_server(rpc.Service(), lab.addr, 0) as server:
        port = server.addresses[0][1]
        async with asyncio.timeout(30):
            with pytest.raises(aiordma.ProtocolMismatchError, match=r"speaks 'aiordma\.rpc'"):
                await streams.open_connection(lab.addr, port)


@pytest.mark.asyncio
async def test_a_plain_channel_to_an_rpc_or_stream_server_is_refused_naming_both(
    lab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 81: open_channel() to an RPC server returned a channel; its first
    message made the server log a broken protocol and the client got
    ConnectionLostError. A plain client speaks plain messages: the server's
    HELLO names what it speaks, and the client is refused there."""
    caplog.set_level(logging.WARNING)
    async with await rpc.start_server(rpc.Service(), lab.addr, 0) as server:
        async with asyncio.timeout(30):
            with pytest.raises(aiordma.ProtocolMismatchError) as info:
                await aiordma.open_channel(lab.addr, server.addresses[0][1])
    assert (info.value.ours, info.value.theirs) == ("", "aiordma.rpc")
    assert "speaks 'aiordma.rpc'" in str(info.value), info.value
    assert "this side plain messages" in str(info.value), info.value
    assert not [r for r in caplog.records if "broke the message protocol" in r.getMessage()]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async with await streams.start_stream_server(serve, lab.addr, 0) as server:
        async with asyncio.timeout(30):
            with pytest.raises(aiordma.ProtocolMismatchError, match=r"speaks 'aiordma\.streams'"):
                await aiordma.open_channel(lab.addr, server.addresses[0][1])


@pytest.mark.asyncio
async def test_an_rpc_client_of_a_plain_channel_server_is_told_it_speaks_plain_messages(
    lab: Lab,
) -> None:
    # Issue 41: the call failed with "RPC frame of 0 bytes is too short". A
    # plain channel accepts any peer (rpc.Service.serve may run on one), so
    # the client learns of the mismatch from the first answer that is not RPC.
    async with await aiordma.start_channel_server(echo_messages, lab.addr, 0) as server:
        port = server.addresses[0][1]
        async with asyncio.timeout(30), await rpc.connect(lab.addr, port) as client:
            assert client._channel.peer_protocol == ""
            with pytest.raises(aiordma.ProtocolMismatchError) as info:
                await client.call("anything", b"x")
    assert (info.value.ours, info.value.theirs) == ("aiordma.rpc", "")
    assert "plain messages" in str(info.value)


@pytest.mark.asyncio
async def test_a_channel_client_of_a_server_without_channels_is_told_so(lab: Lab) -> None:
    """The server posts no receive: the client's HELLO meets none, and
    open_channel raises the completion error whose message asks whether both
    sides set up a channel (not a "dropped" connection)."""
    async with await aiordma.start_server(lambda conn: conn.wait_closed(), lab.addr, 0) as server:
        port = server.addresses[0][1]
        async with asyncio.timeout(60):
            with pytest.raises(aiordma.CompletionError, match="did both sides set up a message"):
                await aiordma.open_channel(lab.addr, port)
