"""Record 0022: Python calls per 64 KiB message on the receiving side of a stream
written as users write it (stream_cpu.py's: ``send_message`` tasks, eight in
flight; the server takes them with ``recv_message_into`` one bytearray).

    aiordma lab -- .venv/bin/python docs/decisions/0022-stream-cost/receiver_calls.py

The server process profiles its measured run only (between the client's two
empty messages) and prints the calls cProfile saw per message, then the most
called functions. cProfile sees Python functions and the C functions Python
calls; compiled code called from compiled code is not counted.
"""

from __future__ import annotations

import asyncio
import cProfile
import importlib.util
import pstats
import subprocess
import sys
from pathlib import Path

import uvloop

import aiordma

_spec = importlib.util.spec_from_file_location(
    "stream_cpu", Path(__file__).with_name("stream_cpu.py")
)
assert _spec is not None
assert _spec.loader is not None
stream = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stream)
"""stream_cpu.py: the stream's client, and its address and size."""

TOP = 25


async def serve() -> None:
    async def handle(channel: aiordma.MessageChannel) -> None:
        into = bytearray(stream.SIZE)
        profile = cProfile.Profile()
        ends = count = 0
        while True:
            if await channel.recv_message_into(into) == 0:  # the end of a run
                ends += 1
                if ends == 2:
                    profile.disable()
                    stats = pstats.Stats(profile)
                    total = sum(row[1] for row in stats.stats.values())  # type: ignore[attr-defined]
                    print(f"receiver: {total / count:.1f} Python calls per message "
                          f"({count} messages)", flush=True)  # fmt: skip
                    stats.sort_stats("ncalls").print_stats(TOP)
                await channel.send_message(b"0 0 0 %d" % count)
                count = 0
                if ends == 1:  # the warm-up ended: count the next run
                    profile.enable()
            else:
                count += 1

    server = await aiordma.start_channel_server(handle, stream.ADDR, 0, max_message=1 << 21)
    print(server.addresses[0][1], flush=True)
    await asyncio.sleep(3600)


def main() -> None:
    if sys.argv[1:] == ["serve"]:
        uvloop.run(serve())
        return
    server = subprocess.Popen(
        [sys.executable, __file__, "serve"], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    try:
        uvloop.run(stream.client(int(server.stdout.readline())))
        server.terminate()
        print(server.communicate(timeout=60)[0], end="")
    finally:
        server.kill()
        server.wait()


main()
