"""Record 0022: how much of the receiver's CPU per 64 KiB message is the completion
drain's (compiled: the driver, the lane, the packet core, the copies of pieces
that land while a receive waits, reposts and credit updates, with their system
calls), against the whole process's, in stream_cpu.py's stream.

    aiordma lab -- .venv/bin/python benchmarks/records/0022-stream-cost/drain_cpu.py

The server wraps each CQ's reader callback (``on_readable``) in a function that
reads this thread's CPU clock (user and kernel time) before and after it; at
the end of each run it prints that sum, and the process's own, per message.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

import aiordma

sys.path.insert(0, str(Path(__file__).parent))
import stream_cpu as stream

"""stream_cpu.py: the stream's client, and its address and size."""

DRAIN = [0.0, 0]
"""CPU seconds inside the CQ reader callbacks, and how many calls."""


def time_the_cq_reader(loop: asyncio.AbstractEventLoop) -> None:
    """Make the loop run each CQ's ``on_readable`` between two reads of the thread's CPU clock."""
    register = loop.add_reader

    def add_reader(fd: Any, callback: Callable[..., object], *args: object) -> None:
        if getattr(callback, "__name__", "") == "on_readable":
            inner = callback

            def timed() -> None:
                start = time.thread_time()
                inner()
                DRAIN[0] += time.thread_time() - start
                DRAIN[1] += 1

            callback = timed
        register(fd, callback, *args)

    loop.add_reader = add_reader  # type: ignore[method-assign]


async def serve() -> None:
    time_the_cq_reader(asyncio.get_running_loop())

    async def handle(channel: aiordma.MessageChannel) -> None:
        into = bytearray(stream.SIZE)
        count, (user, kernel), drain, calls = 0, stream.cpu(), DRAIN[0], DRAIN[1]
        while True:
            if await channel.recv_message_into(into) == 0:  # the end of a run
                now = stream.cpu()
                total = (now[0] - user) + (now[1] - kernel)
                print(f"receiver per message: {total / count * 1e3:.2f} ms CPU in all, "
                      f"{(DRAIN[0] - drain) / count * 1e3:.2f} ms of it in the drain "
                      f"({(DRAIN[0] - drain) / total:.0%}; {(DRAIN[1] - calls) / count:.2f} "
                      f"drain calls); {count} messages", flush=True)  # fmt: skip
                await channel.send_message(b"0 0 0 %d" % count)
                count, (user, kernel), drain, calls = 0, stream.cpu(), DRAIN[0], DRAIN[1]
            else:
                count += 1

    server = await aiordma.start_channel_server(handle, stream.ADDR, 0, max_message=1 << 21)
    print(server.addresses[0][1], flush=True)
    await asyncio.sleep(3600)


def main() -> None:
    if sys.argv[1:] == ["serve"]:
        uvloop.run(serve())
        return
    print(stream.beside_server(__file__, stream.client), end="")


main()
