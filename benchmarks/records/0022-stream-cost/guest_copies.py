"""Record 0022: what a few basic steps cost in this process (run it in a lab guest
and on the host to compare): copying 64 KiB at once and in 8 KiB pieces, a Python
call, a future resolved through the loop, an uncontended asyncio lock.

    aiordma lab -- .venv/bin/python benchmarks/records/0022-stream-cost/guest_copies.py
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import uvloop

SOURCE = memoryview(bytearray(65536))
TARGET = memoryview(bytearray(65536))


def whole() -> None:
    TARGET[:] = SOURCE


def pieces() -> None:
    for i in range(0, 65536, 8192):
        TARGET[i : i + 8192] = SOURCE[i : i + 8192]


def timed(label: str, step: Callable[[], object], times: int) -> None:
    start = time.perf_counter()
    for _ in range(times):
        step()
    print(f"{label}: {(time.perf_counter() - start) / times * 1e6:.2f} us")


async def loop_steps() -> None:
    loop = asyncio.get_running_loop()
    start = time.perf_counter()
    for _ in range(2000):
        fut = loop.create_future()
        loop.call_soon(fut.set_result, None)
        await fut
    print(f"a future resolved through the loop: {(time.perf_counter() - start) / 2e-3:.2f} us")
    lock = asyncio.Lock()
    start = time.perf_counter()
    for _ in range(2000):
        async with lock:
            pass
    print(f"an uncontended asyncio.Lock: {(time.perf_counter() - start) / 2e-3:.2f} us")


timed("64 KiB copied at once", whole, 500)
timed("64 KiB copied in eight 8 KiB pieces", pieces, 500)
timed("bytes() of 64 KiB", lambda: bytes(SOURCE), 500)
timed("a Python call", lambda: None, 100000)
uvloop.run(loop_steps())
