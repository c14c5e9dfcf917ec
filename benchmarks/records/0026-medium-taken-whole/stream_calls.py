"""Record 0022: Python calls per 64 KiB message on each side of a stream written
as users write it (stream_cpu.py's: ``send_message`` tasks, eight in flight;
the server takes them with ``recv_message_into`` one bytearray).

    aiordma lab -- .venv/bin/python benchmarks/records/0026-medium-taken-whole/stream_calls.py

Each process profiles the measured run only (the server between the
client's two empty messages, the client its second run) and prints the
calls cProfile saw per message; the server then prints its most called
functions. cProfile sees Python functions and the C functions Python
calls; compiled code called from compiled code is not counted.
"""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import sys
from pathlib import Path

import uvloop

import aiordma

sys.path.insert(0, str(Path(__file__).parent))
import stream_cpu as stream

"""stream_cpu.py: the stream's client, and its address and size."""

TOP = 25
CALLS: list[int] = []
"""The client's calls in its measured run (the messages are counted by the server)."""


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


async def client(port: int) -> None:
    """stream_cpu.py's client, its measured run profiled."""
    channel = await aiordma.open_channel(stream.ADDR, port, max_message=1 << 21)
    await stream.run(channel, 0.5)
    profile = cProfile.Profile()
    profile.enable()
    report = await stream.run(channel, stream.SECONDS)
    profile.disable()
    total = sum(row[1] for row in pstats.Stats(profile).stats.values())  # type: ignore[attr-defined]
    print(report, flush=True)
    CALLS.append(total)
    await channel.close()


def main() -> None:
    if sys.argv[1:] == ["serve"]:
        uvloop.run(serve())
        return
    output = stream.beside_server(__file__, client)
    count = int(output.split(" messages)")[0].rsplit("(", 1)[1])
    print(f"sender: {CALLS[0] / count:.1f} Python calls per message (the client's "
          "own loop of tasks included)")  # fmt: skip
    print(output, end="")


main()
