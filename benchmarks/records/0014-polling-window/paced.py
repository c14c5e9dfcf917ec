"""What a polling window costs and buys at a given message rate.

    aiordma lab -- sh -c 'for p in 0 200 300 1000; do
        AIORDMA_POLL_US=$p python benchmarks/records/0014-polling-window/paced.py; done'

One channel to the bench peer (uvloop; it inherits ``AIORDMA_POLL_US``, so
both sides poll alike). For each pace (a 64 B round trip, then a pause
until the next is due: back to back, 1 ms, 10 ms) it prints the median
round trip and the CPU the whole machine spent per second (both processes
and rxe's softirqs, from ``/proc/stat``; 2 CPUs make 200%); then the same
CPU with the connection open and idle for 3 s.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import uvloop

import aiordma
from aiordma.bench.runner import Peer
from benchmarks import lab_address
from benchmarks.studies.wake_floor import machine_cpu

PACES = (0.0, 0.001, 0.01)
"""Seconds from the start of one round trip to the next (0: back to back)."""
SECONDS = 3.0


async def paced(channel: aiordma.MessageChannel, pace: float) -> tuple[float, float]:
    """The median round trip (us) and the machine's CPU (% of one CPU) at ``pace``."""
    payload = bytes(64)
    times: list[float] = []
    busy, start = machine_cpu()[0], time.monotonic()
    due = start
    while time.monotonic() - start < SECONDS:
        began = time.perf_counter()
        await channel.send_message(payload)
        await channel.recv_message()
        times.append(time.perf_counter() - began)
        due += pace
        if due > time.monotonic():
            await asyncio.sleep(due - time.monotonic())
    cpu = (machine_cpu()[0] - busy) / (time.monotonic() - start)
    return statistics.median(times) * 1e6, cpu * 100


async def main() -> None:
    addr = lab_address()
    peer = Peer.start(addr, 4096, "uvloop")
    try:
        async with await aiordma.open_channel(addr, peer.port, private_data=b"msgecho") as channel:
            for _ in range(200):  # warm up
                await channel.send_message(b"x")
                await channel.recv_message()
            poll = os.environ.get("AIORDMA_POLL_US", "0") or "0"
            for pace in PACES:
                p50, cpu = await paced(channel, pace)
                name = f"every {pace * 1e3:g} ms" if pace else "back to back"
                print(f"AIORDMA_POLL_US={poll:>5}  {name:<14} p50 {p50:6.0f} us  "
                      f"machine CPU {cpu:4.0f}%", flush=True)  # fmt: skip
            busy, start = machine_cpu()[0], time.monotonic()
            await asyncio.sleep(SECONDS)
            idle = (machine_cpu()[0] - busy) / (time.monotonic() - start) * 100
            print(f"AIORDMA_POLL_US={poll:>5}  idle           machine CPU {idle:4.0f}%", flush=True)
    finally:
        peer.close()


if __name__ == "__main__":
    uvloop.run(main())
