"""Record 0022: a stream of large messages to a server that handles each one before
taking the next, as an application does (``recv_message``, then ``WORK_MS`` of
awaited work), with the messages behind read ahead or not.

    aiordma lab -- .venv/bin/python docs/decisions/0022-stream-cost/read_ahead.py

This process sends ``COUNT`` messages of ``SIZE`` bytes, eight in flight; the
server (another process) takes each with ``recv_message`` and then awaits
``asyncio.sleep(WORK_MS / 1000)``. Prints MB/s from the first send to the
server's last take, and the server's ``large_read_ahead`` count. ``READ_AHEAD``
(bytes) replaces the receiver's budget, to measure it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import uvloop
from stream_cpu import ADDR, beside_server

import aiordma

SIZE = int(os.environ.get("SIZE", 1 << 20))
COUNT = int(os.environ.get("COUNT", 60))
WORK_MS = float(os.environ.get("WORK_MS", 0))


async def serve() -> None:
    if "READ_AHEAD" in os.environ:
        from aiordma.channel import receiver

        receiver.READ_AHEAD = int(os.environ["READ_AHEAD"])  # type: ignore[attr-defined]

    async def handle(channel: aiordma.MessageChannel) -> None:
        taken = 0
        while True:
            message = await channel.recv_message()
            if len(message) == 0:  # the end of a run: report it
                ahead = channel.stats()["counters"].get("large_read_ahead", 0)
                await channel.send_message(f"{taken} {ahead}".encode())
                taken = 0
                continue
            taken += 1
            if WORK_MS:
                await asyncio.sleep(WORK_MS / 1000)

    server = await aiordma.start_channel_server(handle, ADDR, 0, max_message=SIZE)
    print(server.addresses[0][1], flush=True)
    await asyncio.sleep(3600)


async def client(port: int) -> None:
    async with await aiordma.open_channel(ADDR, port, max_message=SIZE) as channel:
        data = bytes(SIZE)
        for count in (8, COUNT):  # a warm-up run, then the measured one
            start = time.perf_counter()
            pending: set[asyncio.Future[None]] = set()
            for _ in range(count):
                if len(pending) >= 8:
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                pending.add(asyncio.ensure_future(channel.send_message(data)))
            await asyncio.gather(*pending)
            await channel.send_message(b"")
            taken, ahead = map(int, (await channel.recv_message()).split())
            took = time.perf_counter() - start
        assert taken == COUNT, taken
        print(
            f"{SIZE} B, work {WORK_MS:g} ms a message: {COUNT * SIZE / took / 1e6:.1f} MB/s, "
            f"{took / COUNT * 1e3:.1f} ms a message; read ahead: {ahead} "
            f"(budget {os.environ.get('READ_AHEAD', 'default')})",
            flush=True,
        )


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        uvloop.run(serve())
    else:
        print(beside_server(__file__, client), end="")
