"""Record 0021: 64 KiB messages, 8 in flight, as a user writes them (``send_message``
tasks, ``recv_message_into`` one bytearray), under several buffer sizes and windows;
MB/s and each process's CPU.

    aiordma lab -- .venv/bin/python benchmarks/records/0021-lab-mtu/stream_shapes.py \
        client 8192/32 16384/32 8192/64 32768/32
"""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys
import time

import uvloop

import aiordma

ADDR = os.environ.get("AIORDMA_ADDR", "192.0.2.1")
SIZE = int(os.environ.get("SIZE", 65536))


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def serve(buffer_size: int, window: int) -> None:
    async def handle(channel: aiordma.MessageChannel) -> None:
        into = bytearray(SIZE)
        start = cpu()
        while True:
            if await channel.recv_message_into(into) == 0:  # the end of a run: our CPU
                await channel.send_message(f"{cpu() - start:.3f}".encode())
                start = cpu()

    server = await aiordma.start_channel_server(
        handle, ADDR, 0, buffer_size=buffer_size, window=window, max_message=1 << 21
    )
    print(server.addresses[0][1], flush=True)
    await asyncio.sleep(3600)


async def client(port: int, buffer_size: int, window: int, seconds: float = 4.0) -> None:
    channel = await aiordma.open_channel(
        ADDR, port, buffer_size=buffer_size, window=window, max_message=1 << 21
    )
    data = bytes(SIZE)

    async def run(seconds: float) -> tuple[float, float, float]:
        sent, start, used = 0, time.perf_counter(), cpu()
        pending: set[asyncio.Future[None]] = set()
        while time.perf_counter() - start < seconds:
            if len(pending) >= 8:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending.add(asyncio.ensure_future(channel.send_message(data)))
            sent += 1
        await asyncio.gather(*pending)
        await channel.send_message(b"")
        peer = float(await channel.recv_message())
        took = time.perf_counter() - start
        return sent * SIZE / took / 1e6, (cpu() - used) / took, peer / took

    await run(0.5)
    rate, mine, peer = await run(seconds)
    stalls = channel.stats()["counters"].get("credit_stalls", 0)
    print(
        f"buffer {buffer_size} window {window}: {rate:.1f} MB/s, sender CPU {mine:.0%}, "
        f"receiver CPU {peer:.0%}, credit stalls {stalls}",
        flush=True,
    )
    await channel.close()


def main() -> None:
    if sys.argv[1] == "serve":
        uvloop.run(serve(int(sys.argv[2]), int(sys.argv[3])))
        return
    for spec in sys.argv[2:]:
        buffer_size, window = map(int, spec.split("/"))
        argv = [sys.executable, __file__, "serve", str(buffer_size), str(window)]
        server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        port = int(server.stdout.readline())
        uvloop.run(client(port, buffer_size, window))
        server.kill()
        server.wait()


main()
