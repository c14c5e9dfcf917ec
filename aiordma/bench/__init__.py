"""``aiordma bench``: aiordma's figures next to perftest's, on the same device, in one run.

Latency modes time one awaited operation at a time (post, then its
completion: a full round trip), and report p50, p99, p99.9 and the mean in
microseconds; perftest's one-way latency figures are doubled to match.
Bandwidth modes keep ``--depth`` operations in flight and report MB/s and
Gbit/s. ``rpc_lat`` is an ``echo`` call; ``rpc_bw`` fetches results into
registered memory with ``--depth`` calls in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from aiordma.bench.stats import Result

MODES = ("write_lat", "read_lat", "send_lat", "write_bw", "read_bw", "rpc_lat", "rpc_bw")

DEFAULT_SIZES = {"lat": [64], "bw": [65536, 1 << 20]}


def _format(result: Result, reference: Result | None) -> str:
    head = f"{result.tool:<9} {result.mode:<10} {result.size:>9} B  depth {result.depth:<3}"
    if result.latency is not None:
        lat = result.latency
        text = (f"{head} p50 {lat.p50:9.1f} us  p99 {lat.p99:9.1f} us  "
                f"p99.9 {lat.p999:9.1f} us  mean {lat.mean:9.1f} us")  # fmt: skip
        if reference is not None and reference.latency is not None and result is not reference:
            text += f"  ({lat.p50 / reference.latency.p50:.1f}x perftest)"
        return text
    text = (f"{head} {result.mb_per_s:9.1f} MB/s  {result.gbit_per_s:6.2f} Gbit/s  "
            f"{result.ops_per_s:9.0f} ops/s")  # fmt: skip
    if reference is not None and result is not reference:
        text += f"  ({result.mb_per_s / reference.mb_per_s:.0%} of perftest)"
    return text


def sizes_for(mode: str, given: list[int] | None) -> list[int]:
    if given:
        return given
    return DEFAULT_SIZES["lat" if mode.endswith("_lat") else "bw"]


async def _run(args: argparse.Namespace, emit: Callable[[Result, Result | None], None]) -> None:
    from aiordma.bench import perftest
    from aiordma.bench.runner import Peer, measure

    sizes = {mode: sizes_for(mode, args.sizes) for mode in args.modes}
    peer = Peer(args.addr, max(max(s) for s in sizes.values()))
    try:
        for mode in args.modes:
            for size in sizes[mode]:
                reference = None
                if "perftest" in args.compare:
                    reference = await asyncio.to_thread(
                        perftest.run,
                        mode,
                        args.device,
                        args.addr,
                        size,
                        args.iterations,
                        args.depth,
                    )
                ours = await measure(peer, mode, size, iterations=args.iterations,
                                     warmup=args.warmup, depth=args.depth)  # fmt: skip
                emit(ours, reference)
                if reference is not None:
                    emit(reference, reference)
    finally:
        peer.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("modes", nargs="+", choices=MODES, metavar="MODE",
                        help=f"one or more of: {', '.join(MODES)}")  # fmt: skip
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                        help="message sizes in bytes, comma-separated (default: 64 for latency "
                        "modes, 64 KiB and 1 MiB for bandwidth modes)")  # fmt: skip
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--depth", type=int, default=8, help="operations in flight (bandwidth)")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    parser.add_argument("--compare", action="append", default=[], choices=["perftest"],
                        help="also run the C reference on the same device")  # fmt: skip
    parser.add_argument("--json", metavar="FILE", help="write every result as JSON ('-': stdout)")
    parser.add_argument("--device", default=os.environ.get("AIORDMA_DEVICE", "rxe0"))
    parser.add_argument("--addr", default=os.environ.get("AIORDMA_ADDR", "192.0.2.1"))


def run(args: argparse.Namespace) -> int:
    results: list[Result] = []

    def emit(result: Result, reference: Result | None) -> None:
        results.append(result)
        print(_format(result, reference), file=sys.stderr if args.json == "-" else sys.stdout,
              flush=True)  # fmt: skip

    runner: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    if args.loop == "uvloop":
        import uvloop

        runner = uvloop.run
    runner(_run(args, emit))
    if args.json:
        text = json.dumps([r.to_json() for r in results], indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as out:
                out.write(text + "\n")
    return 0
