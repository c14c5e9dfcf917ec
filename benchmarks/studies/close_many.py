"""How long closing many message-channel connections takes, and what it logs.

    aiordma lab -- python -m benchmarks close_many [--count N] [--loop asyncio|uvloop]

Opens N connections, each with a message channel on both sides (server and
client in this process, as an operator's load test does), then closes them
all at once. Prints the time to close them and how many log lines of
WARNING or above the close produced, and how many completion queues the
device still holds afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import time

import aiordma


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def _cqs(device: str) -> int:
    out = subprocess.run(["rdma", "-j", "resource", "show"], capture_output=True, text=True)
    return next(int(r["cq"]) for r in json.loads(out.stdout) if r["ifname"] == device)


async def run(addr: str, count: int) -> None:
    async def idle(conn: aiordma.Connection) -> None:
        await conn.wait_closed()

    counter = _Count()
    logging.getLogger("aiordma").addHandler(counter)
    prepare = aiordma.prepare_channel
    async with await aiordma.start_server(idle, addr, 0, prepare=prepare) as server:
        port = server.addresses[0][1]
        start = time.perf_counter()
        conns = [await aiordma.connect(addr, port, prepare=prepare) for _ in range(count)]
        opened = time.perf_counter() - start
        device = conns[0].device.name
        peak = _cqs(device)
        counter.count = 0
        start = time.perf_counter()
        await asyncio.gather(*(c.close() for c in conns))
        server.close()
        server.close_clients()
        await server.wait_closed()
        closed = time.perf_counter() - start
    await asyncio.sleep(0)
    print(f"{count} channel connections: opened in {opened:.2f} s, closed in {closed:.2f} s")
    print(f"log lines at WARNING or above while closing: {counter.count}")
    print(f"completion queues: {peak} at the peak, {_cqs(device)} after closing")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default=os.environ.get("AIORDMA_ADDR", "192.0.2.1"))
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args()
    print(f"loop: {args.loop}")
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(run(args.addr, args.count))
    else:
        asyncio.run(run(args.addr, args.count))


if __name__ == "__main__":
    main()
