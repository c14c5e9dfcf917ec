"""One-sided RDMA: write into and read from a peer's memory, then atomics.

The "server" side registers a buffer with remote access and hands out a
RemoteBuffer (address, length, rkey) — here through a variable, between two
processes as RemoteBuffer.to_bytes(). The "client" side then writes and reads
that memory without the server's CPU taking part.

Run it where an RDMA device exists:  aiordma lab -- python examples/write_read.py
"""

from __future__ import annotations

import asyncio
import sys

import aiordma
from aiordma import Access


async def main(device_name: str | None = None) -> None:
    async with aiordma.Device(device_name) as dev:
        client, server = await aiordma.connect_loopback_pair(dev)

        exposed = dev.alloc(4096, Access.REMOTE_READ | Access.REMOTE_WRITE | Access.REMOTE_ATOMIC)
        wire = exposed.remote().to_bytes()  # what the server would send to the client
        remote = aiordma.RemoteBuffer.from_bytes(wire)
        print(f"server exposes {remote.length} bytes at {remote.addr:#x}, rkey {remote.rkey:#x}")

        local = dev.alloc(4096)
        local.view()[:11] = b"RDMA write!"
        await client.rdma_write(local[:11], remote[100:111])
        print("server memory now holds:", bytes(exposed.view()[100:111]).decode())

        exposed.view()[200:210] = b"from afar."
        await client.rdma_read(local[0:10], remote[200:210])
        print("client read back:", bytes(local.view()[:10]).decode())

        counter = remote[0:8]
        for _ in range(3):
            old = await client.atomic_fetch_add(counter, 5)
            print(f"fetch_add(5): counter was {old}")
        old = await client.atomic_cmp_swap(counter, compare=15, swap=42)
        now = int.from_bytes(exposed.view()[:8], sys.byteorder)
        print(f"cmp_swap(15 -> 42): counter was {old}, now {now}")
        server.close()
        await server.wait_closed()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
