"""Record 0022: stream_cpu.py's stream under cProfile in both processes, the
receiver's completion-channel callback wrapped in a Python function so its
compiled work (the drain, the packet core) shows apart from the Python frames.

    aiordma lab --rwdir /tmp/s -- \
        .venv/bin/python benchmarks/records/0022-stream-cost/stream_profile.py

Writes /tmp/s/server.txt and /tmp/s/client.txt (top 35 by own time, then by
cumulative time).
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import pstats
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).parent))
import stream_cpu as stream

"""stream_cpu.py: the stream, its server and its client, measured here as there."""


def wrap_the_cq_reader(loop: asyncio.AbstractEventLoop) -> None:
    """Make the loop register each CQ's ``on_readable`` (compiled) inside a
    Python function, ``c_on_readable``: its own time in the profile is the
    compiled work of a wake-up."""
    register = loop.add_reader

    def add_reader(fd: Any, callback: Callable[..., object], *args: object) -> None:
        if getattr(callback, "__name__", "") == "on_readable":
            inner = callback

            def c_on_readable() -> None:
                inner()

            callback = c_on_readable
        register(fd, callback, *args)

    loop.add_reader = add_reader  # type: ignore[method-assign]


async def serve() -> None:
    wrap_the_cq_reader(asyncio.get_running_loop())
    await stream.serve()


def dump(prof: cProfile.Profile, name: str) -> None:
    """The profile's top 35 by own time, then by cumulative time, in /tmp/s/NAME.txt."""
    prof.disable()
    with open(f"/tmp/s/{name}.txt", "w") as out:
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats("tottime").print_stats(35)
        stats.sort_stats("cumulative").print_stats(35)


def main() -> None:
    if sys.argv[1:] == ["serve"]:
        prof = cProfile.Profile()

        def stop(*_: object) -> None:
            dump(prof, "server")
            os._exit(0)

        signal.signal(signal.SIGTERM, stop)
        prof.enable()
        uvloop.run(serve())
        return

    async def client(port: int) -> None:
        prof = cProfile.Profile()
        prof.enable()
        await stream.client(port)
        dump(prof, "client")

    stream.beside_server(__file__, client)  # the server writes its profile on SIGTERM


main()
