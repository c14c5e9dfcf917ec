"""Message channels over a real connection (lab device, asyncio and uvloop)."""

from __future__ import annotations

import asyncio
import hashlib
import random

import pytest

import aiordma
from aiordma.messaging import MessageChannel, MessageTooLargeError, prepare_channel
from tests.conftest import Lab


def _payload(i: int, rng: random.Random) -> bytes:
    size = rng.choice([0, 1, 100, 8000, 8152, 8153, 70_000, 1 << 20])
    return hashlib.sha256(str(i).encode()).digest()[:8] * (size // 8) + b"x" * (size % 8)


@pytest.mark.asyncio
async def test_mixed_sizes_arrive_in_order_both_ways(lab: Lab) -> None:
    rng = random.Random(4)
    outgoing = [_payload(i, rng) for i in range(60)]
    got: list[bytes] = []
    done = asyncio.Event()

    async def serve(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        for _ in outgoing:
            message = await channel.recv_message()
            got.append(message)
            await channel.send_message(message[::-1])
        done.set()
        await conn.wait_closed()

    async with await aiordma.start_server(serve, lab.addr, 0, prepare=prepare_channel) as server:
        port = server.addresses[0][1]
        async with await aiordma.connect(lab.addr, port, prepare=prepare_channel) as conn:
            channel: MessageChannel = conn.prepared
            sender = asyncio.gather(*(channel.send_message(m) for m in outgoing))
            replies = [await asyncio.wait_for(channel.recv_message(), 60) for _ in outgoing]
            await sender
            await asyncio.wait_for(done.wait(), 60)
    assert got == outgoing
    assert replies == [m[::-1] for m in outgoing]


@pytest.mark.asyncio
async def test_oversized_message_is_refused_and_the_channel_stays_usable(lab: Lab) -> None:
    async def echo(conn: aiordma.Connection) -> None:
        channel: MessageChannel = conn.prepared
        await channel.send_message(await channel.recv_message())
        await conn.wait_closed()

    async with await aiordma.start_server(echo, lab.addr, 0, prepare=prepare_channel) as server:
        port = server.addresses[0][1]
        async with await aiordma.connect(lab.addr, port, prepare=prepare_channel) as conn:
            channel: MessageChannel = conn.prepared
            with pytest.raises(MessageTooLargeError, match="max_message"):
                await channel.send_message(bytes(channel.max_message + 1))
            await channel.send_message(b"still fine")
            assert await asyncio.wait_for(channel.recv_message(), 30) == b"still fine"
