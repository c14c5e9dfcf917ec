"""How long rdma_cm connection setup takes: ``connect()`` until established.

    aiordma lab -- python benchmarks/connect_setup.py [--count N] [--loop asyncio|uvloop]

The server runs in a child process so both sides do their real work. Prints
percentiles of connect() (address and route resolution, CM handshake, QP
transitions) and of a full connect + close cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiordma
from aiordma.bench.stats import percentile

ROOT = Path(__file__).resolve().parent.parent


def _report(name: str, seconds: list[float]) -> None:
    ms = [s * 1000 for s in seconds]
    print(
        f"{name:<22} n={len(ms):<5} p50 {percentile(ms, 0.5):7.2f} ms   "
        f"p99 {percentile(ms, 0.99):7.2f} ms   mean {statistics.fmean(ms):7.2f} ms"
    )


async def run(addr: str, port: int, count: int) -> None:
    conn = await aiordma.connect(addr, port)  # warm-up: opens the device
    await conn.close()
    setup, cycle = [], []
    for _ in range(count):
        start = time.perf_counter()
        conn = await aiordma.connect(addr, port)
        established = time.perf_counter()
        await conn.close()
        done = time.perf_counter()
        setup.append(established - start)
        cycle.append(done - start)
    _report("connect -> established", setup)
    _report("connect + close", cycle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default=os.environ.get("AIORDMA_ADDR", "192.0.2.1"))
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args()
    print(f"loop: {args.loop}")
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.peer", "serve", args.addr, "0"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(run(args.addr, port, args.count))
        else:
            asyncio.run(run(args.addr, port, args.count))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
