"""Record 0022: a stream of large messages to a server that handles each one before
taking the next, as an application does (``recv_message``, then ``WORK_MS`` of
awaited work), with the next message read ahead or not.

    aiordma lab -- .venv/bin/python benchmarks/records/0028-large-read-ahead/read_ahead.py
    aiordma lab --hosts 2 -- .venv/bin/python benchmarks/records/0028-large-read-ahead/read_ahead.py

This process sends ``COUNT`` messages of ``SIZE`` bytes, eight in flight; the
server (another process; on host 2 of the two-host lab, across its link) takes
each with ``recv_message`` and then awaits ``asyncio.sleep(WORK_MS / 1000)``.
Prints MB/s from the first send to the server's last take, and the server's
``large_read_ahead`` count. ``READ_AHEAD`` sets the server's ``read_ahead``
option (unset: the default).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import uvloop
from stream_cpu import ADDR, beside_server

import aiordma
from aiordma.lab.remote import Fabric

SIZE = int(os.environ.get("SIZE", 1 << 20))
COUNT = int(os.environ.get("COUNT", 60))
WORK_MS = float(os.environ.get("WORK_MS", 0))
READ_AHEAD = os.environ.get("READ_AHEAD")
SCRIPT = os.path.abspath(__file__)


async def serve(addr: str | None) -> None:
    """Serve on ``addr`` for host 1 across the link (printing ``port N``), or
    beside the client (None: printing the port alone, for beside_server)."""

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

    options = {} if READ_AHEAD is None else {"read_ahead": int(READ_AHEAD)}
    server = await aiordma.start_channel_server(
        handle, addr or ADDR, 0, max_message=SIZE, **options
    )
    port = server.addresses[0][1]
    print(port if addr is None else f"port {port}", flush=True)
    await asyncio.sleep(3600)


async def client(addr: str, port: int) -> None:
    async with await aiordma.open_channel(addr, port, max_message=SIZE) as channel:
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
            f"{SIZE} B, work {WORK_MS:g} ms a message, read_ahead {READ_AHEAD or 'default'}: "
            f"{COUNT * SIZE / took / 1e6:.1f} MB/s, {took / COUNT * 1e3:.1f} ms a message; "
            f"read ahead: {ahead}",
            flush=True,
        )


async def across(fabric: Fabric) -> None:
    """The server on host 2, this client on host 1."""
    env = {"WORK_MS": str(WORK_MS), "SIZE": str(SIZE)}
    if READ_AHEAD is not None:
        env["READ_AHEAD"] = READ_AHEAD
    server = fabric.start([sys.executable, SCRIPT, "serve", fabric.peer_addr], env=env)
    try:
        async with asyncio.timeout(120):
            out = await server.wait_for_output("port ")
        await client(fabric.peer_addr, int(out.split("port ", 1)[1].split()[0]))
    finally:
        server.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        uvloop.run(serve(sys.argv[2] if len(sys.argv) > 2 else None))
    elif (fabric := Fabric.from_environment()) is not None:
        uvloop.run(across(fabric))
    else:
        print(beside_server(__file__, lambda port: client(ADDR, port)), end="")
