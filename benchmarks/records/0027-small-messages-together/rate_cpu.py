"""Record 0022: a stream of 64-byte messages as ``msg_rate`` sends it, and what each
message costs each process: CPU (user and kernel) per message and the rate.

    aiordma lab -- .venv/bin/python benchmarks/records/0027-small-messages-together/rate_cpu.py

This process sends ``send_messages`` calls of ``DEPTH`` messages (default 8),
one call at a time, for ``SECONDS`` (default 5); a server process takes them
with ``recv_message`` each, then with ``recv_messages`` (``RECV=one`` or
``many`` runs one of them only), the same run for each.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import uvloop

import aiordma

sys.path.insert(0, str(Path(__file__).parent))
from stream_cpu import ADDR, beside_server, cpu

SIZE = int(os.environ.get("SIZE", 64))
DEPTH = int(os.environ.get("DEPTH", 8))
SECONDS = float(os.environ.get("SECONDS", 5.0))
WAYS = [w for w in ("one", "many") if os.environ.get("RECV", w) == w]


async def serve() -> None:
    async def handle(channel: aiordma.MessageChannel) -> None:
        many = (await channel.recv_message()) == b"many"
        count, (user, kernel) = 0, cpu()
        while True:
            got = await channel.recv_messages() if many else [await channel.recv_message()]
            for message in got:
                if len(message):
                    count += 1
                    continue
                now = cpu()  # the end of a run: report it
                await channel.send_message(f"{now[0] - user} {now[1] - kernel} {count}".encode())
                count, (user, kernel) = 0, cpu()

    server = await aiordma.start_channel_server(handle, ADDR, 0)
    print(server.addresses[0][1], flush=True)
    await asyncio.sleep(3600)


async def run(channel: aiordma.MessageChannel, seconds: float) -> str:
    batch = [bytes(SIZE)] * DEPTH
    sent, start, (user, kernel) = 0, time.perf_counter(), cpu()
    while time.perf_counter() - start < seconds:
        await channel.send_messages(batch)
        sent += DEPTH
    await channel.send_message(b"")
    peer_user, peer_kernel, got = map(float, (await channel.recv_message()).split())
    took = time.perf_counter() - start
    now = cpu()
    us = 1e6 / sent
    assert got == sent, (got, sent)
    return (
        f"{sent / took:,.0f} msg/s; per message: sender {(now[0] - user) * us:.1f} us user + "
        f"{(now[1] - kernel) * us:.1f} us kernel; receiver {peer_user * us:.1f} us user + "
        f"{peer_kernel * us:.1f} us kernel"
    )


async def client(port: int) -> None:
    for way in WAYS:
        channel = await aiordma.open_channel(ADDR, port)
        await channel.send_message(way.encode())
        await run(channel, 0.5)
        print(f"recv_message{'s' if way == 'many' else ''}: {await run(channel, SECONDS)}",
              flush=True)  # fmt: skip
        await channel.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        uvloop.run(serve())
    else:
        print(beside_server(__file__, client), end="")
