"""Where copying a message in pieces stops paying against a rendezvous.

    aiordma lab -- python -m benchmarks medium_threshold [--sizes 16384 65536 ...] [--json]

A message channel sends a body too large for one packet either as pieces
copied through its registered slots (``medium_limit`` at or above the
size) or by rendezvous: the body registered for the peer to read, read by
the peer, and a DONE back (``medium_limit=0``). For each size and each
way, against an echo server in another process (so the two sides run in
parallel, as in an application):

- ``lat``: the median round trip of one message echoed back whole;
- ``bw``: MB/s of ``--depth`` messages in flight, sent to a server that
  answers each with one byte.

Plain ``bytes`` bodies, or with ``--registered`` bodies in registered
memory (``Device.shared().alloc``) as a caller that registered for speed
sends them; default windows and buffers otherwise. Prints one
line per size, or one JSON line per size with ``--json``; the decision
record that chose ``DEFAULT_MEDIUM_LIMIT`` cites it (docs/decisions/0006).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

import aiordma
from aiordma.bench.stats import Latency
from benchmarks import lab_address

SIZES = (16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20)
WAYS = {"pieces": 1 << 30, "rendezvous": 0}

_SERVER = """
import asyncio, sys, aiordma

async def serve(channel):
    async for message in channel:
        await channel.send_message(message if len(message) != 1 and message[:1] == b"e" else b"k")

async def main():
    server = await aiordma.start_channel_server(
        serve, sys.argv[1], 0, medium_limit=int(sys.argv[2]), max_message=64 << 20)
    print(server.addresses[0][1], flush=True)
    await server.serve_forever()

asyncio.run(main())
"""


def _bodies(size: int, registered: bool) -> list[bytes] | list[aiordma.MemoryRegion]:
    """A body the server echoes back whole, and one it answers with one byte."""
    echoed = b"e" + bytes(size - 1)
    acked = b"a" + bytes(size - 1)
    if not registered:
        return [echoed, acked]
    regions = []
    for body in (echoed, acked):
        region = aiordma.Device.shared().alloc(size)
        region.view()[:] = body
        regions.append(region)
    return regions


async def _measure(
    host: str, port: int, size: int, limit: int, rounds: int, depth: int, registered: bool
) -> dict[str, float]:
    channel = await aiordma.open_channel(host, port, medium_limit=limit, max_message=64 << 20)
    bodies = _bodies(size, registered)
    echoed, acked = bodies
    async with channel:
        samples = []
        for i in range(rounds + 3):
            start = time.perf_counter()
            await channel.send_message(echoed)
            await channel.recv_message()
            if i >= 3:  # the first few pay for first use
                samples.append(time.perf_counter() - start)
        count = max(depth * 2, rounds)
        start = time.perf_counter()

        async def acks() -> None:
            for _ in range(count):
                await channel.recv_message()

        reader = asyncio.ensure_future(acks())
        for _ in range(count):
            await channel.send_message(acked)
        await reader
        elapsed = time.perf_counter() - start
    for body in bodies:
        if isinstance(body, aiordma.MemoryRegion):
            body.close()
    latency = Latency.of(samples).p50  # in microseconds
    return {"lat_us": latency, "bw_mbs": count * size / elapsed / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--registered", action="store_true",
                        help="send from registered memory instead of bytes")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    host = lab_address()
    servers = {}
    try:
        for way, limit in WAYS.items():
            proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER, host, str(limit)],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdout is not None
            servers[way] = (proc, int(proc.stdout.readline()))
        for size in args.sizes:
            row: dict[str, object] = {"size": size}
            for way, limit in WAYS.items():
                port = servers[way][1]
                figures = asyncio.run(
                    _measure(host, port, size, limit, args.rounds, args.depth, args.registered)
                )
                row[way] = figures
            if args.json:
                print(json.dumps(row), flush=True)
                continue
            pieces, rendezvous = row["pieces"], row["rendezvous"]
            assert isinstance(pieces, dict)
            assert isinstance(rendezvous, dict)
            lat = pieces["lat_us"] / rendezvous["lat_us"]
            bw = pieces["bw_mbs"] / rendezvous["bw_mbs"]
            print(
                f"{size:>8} B  lat p50 pieces {pieces['lat_us']:9.0f} us  rendezvous "
                f"{rendezvous['lat_us']:9.0f} us ({lat:.2f}x)   bw pieces "
                f"{pieces['bw_mbs']:6.1f} MB/s  rendezvous {rendezvous['bw_mbs']:6.1f} MB/s "
                f"({bw:.2f}x)",
                flush=True,
            )
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
