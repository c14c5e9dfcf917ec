"""The passive side of ``aiordma bench``, run as its own process.

    python -m aiordma.bench.peer ADDR MAX_SIZE [asyncio|uvloop]

Each connection says in its private data what it needs: ``mem`` (a buffer
the client writes and reads, handed over as a RemoteBuffer), ``echo``
(every message sent back), ``sink`` (every message received and dropped,
receives re-posted as lists) or nothing (an RPC service with ``echo``,
``sink`` and ``source``). The TCP baseline (:mod:`aiordma.bench.tcp`) is
served on a second port, and a transfer agent with a pool peers may read
and write (the ``xfer_*`` modes) on a third. Prints ``listening RDMA_PORT
TCP_PORT AGENT POOL`` (the agent's metadata and the pool's descriptor
list, in hex); runs until killed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import sys
from typing import Any

import aiordma
from aiordma import Access, rpc
from aiordma.bench import counts, tcp
from aiordma.channel.channel import MessageChannel
from aiordma.channel.open import channel_factory, prepare_channel
from aiordma.channel.options import DEFAULT_MAX_MESSAGE
from aiordma.transfer import start_agent

XFER_POOL = 64 << 20
"""Bytes of the transfer agent's pool (the ``xfer_*`` modes' target)."""


ECHO_DEPTH = 64
SINK_DEPTH = 1024
"""Receives a ``sink`` connection keeps posted: slack for bursts, so a sender
outrunning this process meets receiver-not-ready retries as late as possible."""


def service() -> rpc.Service:
    svc = rpc.Service()
    regions: dict[int, aiordma.MemoryRegion] = {}

    @svc.method()
    async def echo(payload: bytes) -> bytes:
        return payload

    @svc.method()
    async def sink(payload: bytes) -> bytes:
        return b""

    @svc.method()
    async def source(payload: bytes) -> aiordma.MemoryRegion:
        size = int(payload)
        if size not in regions:
            regions[size] = aiordma.Device.shared().alloc(size, Access.REMOTE_READ)
        return regions[size]

    return svc


async def relay(channel: MessageChannel, kind: bytes, max_size: int) -> None:
    """``msgecho``: send every message back; ``msgsink``: drop them. Either
    answers an empty message (the end of a burst, or a probe) with this
    side's work counts (:mod:`aiordma.bench.counts`). ``_reg``: receive into registered
    memory; ``_into``: into one plain ``bytearray``; ``_many``: take what is
    queued with ``recv_messages``."""
    echo = kind.startswith(b"msgecho")
    many = kind.endswith(b"_many")
    inbox: aiordma.MemoryRegion | bytearray | None = None
    if kind.endswith(b"_reg"):
        inbox = channel.conn.alloc(max_size)
    elif kind.endswith(b"_into"):
        inbox = bytearray(max_size)
    with contextlib.suppress(aiordma.ConnectionLostError, aiordma.ResourceClosedError):
        while True:
            if many:  # what has arrived, in one call
                for taken in await channel.recv_messages():
                    if not len(taken):
                        await channel.send_message(counts.encode(channel.conn.qp))
                    elif echo:
                        await channel.send_message(taken)
                continue
            message: aiordma.Segment | bytes | bytearray
            if inbox is not None:
                n = await channel.recv_message_into(inbox)
                message = inbox[:n] if n else b""
            else:
                message = await channel.recv_message()
            if not len(message):
                await channel.send_message(counts.encode(channel.conn.qp))
            elif echo:
                await channel.send_message(message)


async def serve(addr: str, max_size: int) -> None:
    device = aiordma.Device.shared()
    memory = device.alloc(max_size, Access.REMOTE_READ | Access.REMOTE_WRITE)
    svc = service()

    def accept(request: aiordma.ConnectionRequest) -> bytes:
        return memory.remote().to_bytes()

    messages = channel_factory(max_message=max(max_size, DEFAULT_MAX_MESSAGE))

    async def prepare(conn: aiordma.Connection) -> Any:
        kind = conn.peer_private_data.rstrip(b"\0")
        if kind == b"":  # rpc.connect sends no private data
            return await prepare_channel(conn)
        if kind.startswith(b"msg"):
            return await messages(conn)
        if kind == b"echo":
            inbox = conn.alloc(max_size * ECHO_DEPTH)
            slots = [inbox[i * max_size : (i + 1) * max_size] for i in range(ECHO_DEPTH)]
            return slots, await conn.post_recv_batch(slots)
        if kind == b"sink":  # every receive lands in the same buffer: only the count matters
            inbox = conn.alloc(max_size)
            return inbox, collections.deque(await conn.post_recv_batch([inbox] * SINK_DEPTH))
        return None

    async def handle(conn: aiordma.Connection) -> None:
        kind = conn.peer_private_data.rstrip(b"\0")
        if kind == b"":
            await svc.handle(conn)
        elif kind.startswith(b"msg"):
            await relay(conn.prepared, kind, max_size)
        elif kind == b"echo":
            slots, pending = conn.prepared
            i = 0
            while True:
                wc = await pending[i]
                (pending[i],) = await conn.post_recv_batch([slots[i]])
                await conn.post_send(slots[i][: wc.byte_len])
                i = (i + 1) % ECHO_DEPTH
        elif kind == b"sink":
            inbox, posted = conn.prepared
            while True:
                await posted.popleft()
                arrived = 1
                while posted and posted[0].done():
                    posted.popleft().result()
                    arrived += 1
                posted.extend(await conn.post_recv_batch([inbox] * arrived))
        else:
            await conn.wait_closed()

    options = aiordma.QueuePairOptions(recv_depth=SINK_DEPTH)
    server = await aiordma.start_server(
        handle, addr, 0, accept=accept, prepare=prepare, options=options
    )
    baseline = await tcp.start_server(addr)
    tcp_port = baseline.sockets[0].getsockname()[1]
    async with await start_agent(addr) as agent:  # the transfer modes' target
        pool = agent.alloc(XFER_POOL, remote=Access.REMOTE_READ | Access.REMOTE_WRITE)
        exported = pool.blocks(XFER_POOL).to_bytes().hex()
        print(f"listening {server.addresses[0][1]} {tcp_port} {agent.metadata().hex()} "
              f"{exported}", flush=True)  # fmt: skip
        await server.serve_forever()


if __name__ == "__main__":
    addr, max_size, *loop = sys.argv[1:]
    if loop == ["uvloop"]:
        import uvloop

        uvloop.run(serve(addr, int(max_size)))
    else:
        asyncio.run(serve(addr, int(max_size)))
