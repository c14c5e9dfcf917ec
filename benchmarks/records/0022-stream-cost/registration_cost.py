"""Record 0022, "What bounds a stream of 1 MiB messages": what a landing costs in this
process at 64 KiB, 1 MiB and 4 MiB: registering and deregistering one buffer again and
again, for local access and for remote reading; a new bytearray registered and
deregistered (a large message taken as a new object); the allocation alone; a copy
into an existing buffer; ``bytes()`` of a buffer (a copy out into a new object).

    aiordma lab -- .venv/bin/python benchmarks/records/0022-stream-cost/registration_cost.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import aiordma
from aiordma import Access

device = aiordma.Device()


def timed(label: str, step: Callable[[], object], times: int = 50) -> None:
    start = time.perf_counter()
    for _ in range(times):
        step()
    print(f"{label}: {(time.perf_counter() - start) / times * 1e6:.0f} us")


def one_size(size: int) -> None:
    buffer, source = bytearray(size), bytearray(size)

    def again() -> None:
        device.register(buffer).close()

    def remote() -> None:
        device.register(buffer, Access.LOCAL_WRITE | Access.REMOTE_READ).close()

    def new() -> None:
        device.register(bytearray(size)).close()

    def copy() -> None:
        buffer[:] = source

    print("== size", size)
    timed("register+close same buffer", again)
    timed("register+close remote read", remote)
    timed("new bytearray + register + close", new)
    timed("bytearray(size)", lambda: bytearray(size))
    timed("copy into", copy)
    timed("bytes(src)", lambda: bytes(source))


for each in (65536, 1 << 20, 4 << 20):
    one_size(each)
