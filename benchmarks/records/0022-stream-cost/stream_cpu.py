"""Record 0022: 64 KiB messages, 8 in flight, as a user writes them, and what each
message costs each process: CPU (user and kernel) and the receiving queue's armings.

    aiordma lab -- .venv/bin/python benchmarks/records/0022-stream-cost/stream_cpu.py

A server process receives with ``recv_message_into`` one bytearray; this process
sends with ``send_message`` tasks, eight at a time, for ``SECONDS`` (default 5);
both sides' buffers are ``BUFFER_SIZE`` bytes (default 8192, the channel's).
"""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import uvloop

import aiordma

ADDR = os.environ.get("AIORDMA_ADDR", "192.0.2.1")
SIZE = int(os.environ.get("SIZE", 65536))
SECONDS = float(os.environ.get("SECONDS", 5.0))
BUFFER_SIZE = int(os.environ.get("BUFFER_SIZE", 8192))


def cpu() -> tuple[float, float]:
    """This process's user and kernel CPU seconds so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def arms(channel: aiordma.MessageChannel) -> float:
    return channel.conn.qp.completion_queue.waiting()["arms"]


async def serve() -> None:
    async def handle(channel: aiordma.MessageChannel) -> None:
        into = bytearray(SIZE)
        count, (user, kernel), armed = 0, cpu(), arms(channel)
        while True:
            if await channel.recv_message_into(into) == 0:  # the end of a run: report it
                now = cpu()
                report = f"{now[0] - user} {now[1] - kernel} {arms(channel) - armed} {count}"
                await channel.send_message(report.encode())
                count, (user, kernel), armed = 0, cpu(), arms(channel)
            else:
                count += 1

    server = await aiordma.start_channel_server(
        handle, ADDR, 0, max_message=1 << 21, buffer_size=BUFFER_SIZE
    )
    print(server.addresses[0][1], flush=True)
    await asyncio.sleep(3600)


async def run(channel: aiordma.MessageChannel, seconds: float) -> str:
    data = bytes(SIZE)
    sent, start, (user, kernel), armed = 0, time.perf_counter(), cpu(), arms(channel)
    pending: set[asyncio.Future[None]] = set()
    while time.perf_counter() - start < seconds:
        if len(pending) >= 8:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        pending.add(asyncio.ensure_future(channel.send_message(data)))
        sent += 1
    await asyncio.gather(*pending)
    await channel.send_message(b"")
    peer_user, peer_kernel, peer_arms, got = map(float, (await channel.recv_message()).split())
    took = time.perf_counter() - start
    now = cpu()
    ms = 1e3 / sent
    assert got == sent, (got, sent)
    return (
        f"{sent * SIZE / took / 1e6:.1f} MB/s; per message: sender {(now[0] - user) * ms:.2f} ms "
        f"user + {(now[1] - kernel) * ms:.2f} ms kernel, {(arms(channel) - armed) / sent:.2f} "
        f"armings; receiver {peer_user * ms:.2f} ms user + {peer_kernel * ms:.2f} ms kernel, "
        f"{peer_arms / sent:.2f} armings"
    )


async def client(port: int) -> None:
    channel = await aiordma.open_channel(ADDR, port, max_message=1 << 21, buffer_size=BUFFER_SIZE)
    await run(channel, 0.5)
    print(await run(channel, SECONDS), flush=True)
    await channel.close()


def beside_server(script: str, client: Callable[[int], Awaitable[None]]) -> str:
    """Start ``script serve`` (a server printing its port first), run ``client(port)``
    here, then stop the server with SIGTERM; what else the server printed."""
    server = subprocess.Popen([sys.executable, script, "serve"], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    try:
        uvloop.run(client(int(server.stdout.readline())))  # type: ignore[arg-type]
        server.terminate()
        return server.communicate(timeout=60)[0]
    finally:
        server.kill()
        server.wait()


def main() -> None:
    if sys.argv[1:] == ["serve"]:
        uvloop.run(serve())
        return
    print(beside_server(__file__, client), end="")


if __name__ == "__main__":  # the other scripts of this record import it
    main()
