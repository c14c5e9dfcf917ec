"""Send and receive between two connected queue pairs on one device.

Run it where an RDMA device exists:  aiordma lab -- python examples/loopback_send_recv.py
"""

from __future__ import annotations

import asyncio
import sys

import aiordma


async def main(device_name: str | None = None) -> None:
    async with aiordma.Device(device_name) as dev:
        client, server = await aiordma.connect_loopback_pair(dev)
        inbox = dev.alloc(4096)  # LOCAL_WRITE: the adapter writes received data here
        outbox = dev.register(bytearray(b"hello over RDMA"))

        receiving = asyncio.ensure_future(server.post_recv(inbox))  # post before the peer sends
        await asyncio.sleep(0)
        sent = await client.post_send(outbox)
        received = await receiving
        print(f"sent {sent.opcode.name}, received {received.byte_len} bytes:",
              bytes(inbox.view()[: received.byte_len]).decode())  # fmt: skip

        replies = await server.post_recv_batch([inbox[:64]])
        await client.send_with_imm(outbox[:5], imm=0xC0FFEE)
        wc = await replies[0]
        print(f"send_with_imm delivered imm={wc.imm_data:#x} and {wc.byte_len} bytes")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
