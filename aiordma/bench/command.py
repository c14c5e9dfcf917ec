"""The ``aiordma bench`` command line: arguments, the run, the table, JSON and plot."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiordma.bench.stats import Result
from aiordma.lab.remote import Fabric, PeerProcess

MODES = (
    "write_lat", "read_lat", "send_lat", "write_bw", "read_bw", "send_rate",
    "rpc_lat", "rpc_bw", "rpc_fetch", "rpc_sink", "connect",
    "msg_lat", "msg_bw", "msg_into_bw", "msg_rate", "msg_reg_lat", "msg_reg_bw", "xfer_read",
    "xfer_write",
)  # fmt: skip

KINDS = {"rpc_fetch": "bw", "rpc_sink": "bw", "connect": "lat", "xfer_read": "bw",
         "xfer_write": "bw"}  # fmt: skip
"""Modes whose name does not end in their kind (``_lat``, ``_bw``, ``_rate``)."""

REMOTE_STOP_TIMEOUT = 30.0
"""Seconds to wait for a perftest server on host 2 to listen, or to be gone."""

DEFAULT_SIZES = {"lat": [64], "bw": [65536, 1 << 20], "rate": [64]}


def pace(text: str) -> float:
    """Seconds from ``'1ms'``, ``'500us'``, ``'0.01s'`` or ``'0.01'``."""
    number = text.strip().lower()
    scale = 1.0
    for unit, factor in (("us", 1e-6), ("ms", 1e-3), ("s", 1.0)):
        if number.endswith(unit):
            number, scale = number[: -len(unit)], factor
            break
    try:
        seconds = float(number) * scale
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(f"a pace is a time such as 1ms or 500us, not {text!r}")
    return seconds


def kind_of(mode: str) -> str:
    """``lat``, ``bw`` or ``rate``: what a mode measures."""
    return KINDS.get(mode) or mode.rsplit("_", 1)[1]


def sizes_for(mode: str, given: list[int] | None) -> list[int]:
    if mode == "connect":
        return [0]  # no payload: one measurement, whatever --sizes says
    if given:
        return given
    return DEFAULT_SIZES[kind_of(mode)]


def peer_size(sizes: dict[str, list[int]]) -> int:
    """The largest message the peer must take: the largest size any mode
    moves, and at least a byte (``connect`` alone moves none, and the peer
    still registers its buffers)."""
    return max(1, *(max(s) for s in sizes.values()))


async def _run(args: argparse.Namespace, emit: Callable[[list[Result]], None]) -> None:
    from aiordma.bench import perftest
    from aiordma.bench.report import Progress
    from aiordma.bench.runner import Peer, Plan, measure, measure_tcp

    sizes = {mode: sizes_for(mode, args.sizes) for mode in args.modes}
    tools = set(args.compare)
    steps = sum(
        len(sizes[mode])
        * (
            1
            + len(tools - ({"perftest"} if mode not in perftest.TOOLS else set()))
            + ("perftest" in tools and mode in perftest.EVENTS)
        )
        for mode in args.modes
    )
    progress = Progress(steps)
    plan = Plan(args.iterations, args.warmup, args.depth, args.duration, args.pace)
    largest = peer_size(sizes)
    start_server: Callable[[list[str]], Callable[[], None]] = perftest.start_local
    fabric = None
    if args.remote:
        fabric = Fabric.from_environment()
        if fabric is None:
            raise SystemExit(
                "aiordma bench: --remote runs the peer on host 2 of the two-host lab; "
                "run it there: aiordma lab --hosts 2 -- aiordma bench --remote ..."
            )
        peer = await Peer.start_remote(fabric, largest, args.loop)
        start_server = remote_starter(fabric)
        if args.netem:
            await fabric.netem(args.netem)
    else:
        if args.netem:
            raise SystemExit("aiordma bench: --netem impairs the two-host lab's link: "
                             "give --remote too")  # fmt: skip
        peer = Peer.start(args.addr, largest, args.loop)

    async def across(run: Awaitable[Result | None]) -> Result | None:
        """``run``'s result; with ``--remote``, with what crossed the link (``extra["link"]``)."""
        if fabric is None:
            return await run
        before = await fabric.link_bytes()
        result = await run
        moved = (await fabric.link_bytes()).since(before)
        if result is not None:
            result.extra["link"] = moved.to_json(
                result.size * result.iterations, warmup=result.size * result.warmup
            )
        return result

    try:
        for mode in args.modes:
            for size in sizes[mode]:
                progress.start(f"aiordma {mode} {size} B")
                ours = await across(measure(peer, mode, size, plan, progress.update))
                assert ours is not None
                group = [ours]
                if "perftest" in tools and mode in perftest.TOOLS:
                    for events in (False, True) if mode in perftest.EVENTS else (False,):
                        flag = " -e" if events else ""
                        progress.start(f"{perftest.TOOLS[mode]}{flag} {size} B")
                        reference = await across(asyncio.to_thread(
                            perftest.run, mode, args.device, peer.addr, size,
                            group[0].iterations, 1 if kind_of(mode) == "lat" else args.depth,
                            start_server, events,
                        ))  # fmt: skip
                        if reference is not None:
                            group.append(reference)
                if "tcp" in tools:
                    progress.start(f"tcp {mode} {size} B")
                    theirs = await across(measure_tcp(peer, mode, size, plan, progress.update))
                    assert theirs is not None
                    group.append(theirs)
                progress.clear()
                emit(group)
    finally:
        peer.close()
        if fabric is not None and args.netem:
            await fabric.netem(None)


def _wait_remote(proc: PeerProcess, timeout: float) -> int | None:
    """Poll (from a worker thread) until ``proc`` on host 2 exits; its status."""
    deadline = time.monotonic() + timeout
    while proc.returncode is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc.returncode


def remote_starter(fabric: Fabric) -> Callable[[list[str]], Callable[[], None]]:
    """Start perftest's servers on host 2 (called from a worker thread).

    A server is started only once its predecessor is gone (it needs the
    port), and handed over only once it listens: a perftest client that
    reaches host 2 before its server listens can hang.
    """

    from aiordma.bench.perftest import PORT

    def start(argv: list[str]) -> Callable[[], None]:
        port = argv[argv.index("-p") + 1] if "-p" in argv else PORT
        proc = fabric.start(argv)
        listening = fabric.start(["sh", "-c",
            f"until rdma resource show cm_id | grep LISTEN | grep -qE ':{port}( |$)'; "
            "do sleep 0.05; done"])  # fmt: skip
        if _wait_remote(listening, REMOTE_STOP_TIMEOUT) is None:
            listening.send_signal(signal.SIGKILL)

        def stop() -> None:
            proc.send_signal(signal.SIGKILL)
            _wait_remote(proc, REMOTE_STOP_TIMEOUT)

        return stop

    return start


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("modes", nargs="+", choices=MODES, metavar="MODE",
                        help=f"one or more of: {', '.join(MODES)}")  # fmt: skip
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                        help="message sizes in bytes, comma-separated (default: 64 for latency "
                        "modes, 64 KiB and 1 MiB for bandwidth modes)")  # fmt: skip
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--duration", type=float, metavar="SECONDS",
                        help="measure for this long instead of --iterations (perftest then "
                        "runs as many iterations as aiordma did)")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--pace", type=pace, metavar="TIME",
                        help="latency modes: start one operation per TIME ('1ms', '10ms', "
                             "'500us') instead of back to back")  # fmt: skip
    parser.add_argument("--depth", type=int, default=8, help="operations in flight (bandwidth)")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="uvloop")
    parser.add_argument("--compare", action="append", default=[], choices=["perftest", "tcp"],
                        help="also run perftest (the C reference, same device; with -e too "
                        "for send and message latency) or the same pattern over asyncio TCP "
                        "streams (same address); repeatable")  # fmt: skip
    parser.add_argument("--json", metavar="FILE", help="write every result as JSON ('-': stdout)")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="draw latency and throughput against size "
                        "(needs aiordma[bench])")  # fmt: skip
    parser.add_argument("--remote", action="store_true",
                        help="run the peer and perftest's servers on host 2 of the two-host "
                        "lab ('aiordma lab --hosts 2'), measuring across its link")  # fmt: skip
    parser.add_argument("--netem", metavar="SPEC",
                        help="with --remote: impair the link both ways with tc netem while "
                        "measuring (e.g. 'loss 1%%')")  # fmt: skip
    parser.add_argument("--device", default=os.environ.get("AIORDMA_DEVICE", "rxe0"))
    parser.add_argument("--addr", default=os.environ.get("AIORDMA_ADDR", "192.0.2.1"))


def run(args: argparse.Namespace) -> int:
    from aiordma.bench.report import row

    results: list[Result] = []
    table = sys.stderr if args.json == "-" else sys.stdout

    def emit(group: list[Result]) -> None:
        results.extend(group)
        print(row(group[0], group[1:]), file=table, flush=True)
        for reference in group[1:]:
            print(row(reference), file=table, flush=True)

    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("aiordma bench: --plot needs matplotlib (pip install 'aiordma[bench]')",
                  file=sys.stderr)  # fmt: skip
            return 2
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
    if args.plot:
        from aiordma.bench.plot import plot

        plot(results, args.plot, f"aiordma bench on {args.device} ({args.loop})")
    return 0
