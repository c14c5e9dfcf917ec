"""Record 0019: an RPC client calling an echo method one call after another, in
another process than the server; the p50 and p90 of a call, and what each side's
completion queue did (spins, hits, misses, armings).

    aiordma lab -- .venv/bin/python benchmarks/records/0019-waiting-policy/rpc_waiting.py
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import uvloop

import aiordma
from aiordma import rpc

ADDR = os.environ.get("AIORDMA_ADDR", "192.0.2.1")
CALLS = int(os.environ.get("CALLS", 600))
COUNTERS = ("spins", "spin_hits", "spin_misses", "spins_skipped", "arms")


def counts() -> dict[str, int]:
    """This process's completion queues' counters, summed."""
    total = dict.fromkeys(COUNTERS, 0)
    for labels, stats in aiordma.metrics.collect():
        if "completion_queue" in labels:
            for name in COUNTERS:
                total[name] += int(stats.counters.get(name, 0))
    return total


async def serve() -> None:
    service = rpc.Service()

    @service.method()
    async def echo(payload: bytes) -> bytes:
        return payload

    @service.method()
    async def report(_: bytes) -> bytes:
        return json.dumps(counts()).encode()

    server = await rpc.start_server(service, ADDR, 0)
    print(server.addresses[0][1], flush=True)
    await asyncio.sleep(3600)


async def client(port: int) -> None:
    async with await rpc.connect(ADDR, port) as caller:
        payload = bytes(64)
        for _ in range(50):
            await caller.call("echo", payload)
        theirs, mine = json.loads(await caller.call("report", b"")), counts()
        took = []
        for _ in range(CALLS):
            start = time.perf_counter()
            await caller.call("echo", payload)
            took.append(time.perf_counter() - start)
        theirs_after, mine_after = json.loads(await caller.call("report", b"")), counts()
    took.sort()
    print(f"  {CALLS} calls: p50 {took[CALLS // 2] * 1e6:.0f} us, "
          f"p90 {took[CALLS * 9 // 10] * 1e6:.0f} us")  # fmt: skip
    for side, before, after in (("server", theirs, theirs_after), ("client", mine, mine_after)):
        print(f"  {side}: " + ", ".join(f"{k} {after[k] - before[k]}" for k in COUNTERS))


def main() -> None:
    if sys.argv[1:] == ["serve"]:
        uvloop.run(serve())
        return
    server = subprocess.Popen(
        [sys.executable, __file__, "serve"], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    try:
        uvloop.run(client(int(server.stdout.readline())))
    finally:
        server.kill()
        server.wait()


main()
