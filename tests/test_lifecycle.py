"""The closing protocol's thread rule, for every object with a ``close()``
bound to an event loop: from another thread it raises WrongLoopError and
changes nothing, and the object still closes on its own loop (issue 81)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import aiordma
from aiordma import rpc
from aiordma.streams import open_connection
from aiordma.transfer import start_agent
from tests.conftest import Lab, echo_messages

TIMEOUT = 60


async def refused_elsewhere(close: Callable[[], object]) -> None:
    """``close()`` run in a worker thread while this loop runs raises WrongLoopError."""
    with pytest.raises(aiordma.WrongLoopError, match="another thread"):
        await asyncio.to_thread(close)


@pytest.mark.asyncio
async def test_verbs_objects_refuse_close_from_another_thread(lab: Lab) -> None:
    async with aiordma.Device(lab.device) as device:
        a, b = await aiordma.connect_loopback_pair(device)
        await refused_elsewhere(a.close)
        assert not a.is_closing()
        src, dst = device.register(b"still here"), device.alloc(16)
        (arrival,) = await b.post_recv_batch([dst])
        await asyncio.wait_for(a.post_send(src), TIMEOUT)
        assert (await asyncio.wait_for(arrival, TIMEOUT)).byte_len == 10
        cq = a.completion_queue
        await refused_elsewhere(cq.close)
        await refused_elsewhere(device.close)
        assert not device.closed
        async with aiordma.SharedReceiveQueue(device, buffers=8) as pool:
            await refused_elsewhere(pool.close)
            assert not pool.is_closing()
        for qp in (a, b):
            await asyncio.wait_for(qp.aclose(), TIMEOUT)
    assert device.closed


@pytest.mark.asyncio
async def test_connections_and_channels_refuse_close_from_another_thread(lab: Lab) -> None:
    async with await aiordma.start_channel_server(echo_messages, lab.addr, 0) as server:
        await refused_elsewhere(server.close)
        port = server.addresses[0][1]
        async with await aiordma.open_channel(lab.addr, port) as channel:
            await refused_elsewhere(channel.close)
            await refused_elsewhere(channel.conn.close)
            assert not channel.is_closing()
            await channel.send_message(b"still open")
            assert await asyncio.wait_for(channel.recv_message(), TIMEOUT) == b"still open"
            await asyncio.wait_for(channel.aclose(), TIMEOUT)  # and it closes on its loop
        assert channel.conn.closed


@pytest.mark.asyncio
async def test_rpc_clients_streams_and_agents_refuse_close_from_another_thread(
    lab: Lab,
) -> None:
    service = rpc.Service()

    @service.method()
    async def echo(value: bytes) -> bytes:
        return value

    async with await rpc.start_server(service, lab.addr, 0) as server:
        client = await rpc.connect(lab.addr, server.addresses[0][1])
        await refused_elsewhere(client.close)
        assert not client.is_closing()
        assert await asyncio.wait_for(client.call("echo", b"x"), TIMEOUT) == b"x"
        await asyncio.wait_for(client.aclose(), TIMEOUT)

    async def shout(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write((await reader.readline()).upper())
        await writer.drain()
        writer.close()

    async with await aiordma.start_stream_server(shout, lab.addr, 0) as server:
        reader, writer = await open_connection(lab.addr, server.addresses[0][1])
        await refused_elsewhere(writer.close)
        await refused_elsewhere(writer.transport.abort)
        writer.write(b"hi\n")
        assert await asyncio.wait_for(reader.readline(), TIMEOUT) == b"HI\n"
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), TIMEOUT)

    agent = await start_agent(lab.addr)
    await refused_elsewhere(agent.close)
    assert not agent.is_closing()
    await asyncio.wait_for(agent.aclose(), TIMEOUT)
