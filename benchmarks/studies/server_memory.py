"""A server's memory under two abuses: an RPC client that floods large
requests and reads no reply, and many short connections.

    aiordma lab -- python -m benchmarks server_memory [--size 16MiB] [--count 24]
                                                    [--cycles 300] [--json]

*Flood*: an RPC server (a child process, a handler returning a copy of its
payload) and a client that posts ``--count`` requests of ``--size`` bytes
through a channel whose ``max_exposed`` is one request, and reads nothing.
The server's resident memory is sampled every 50 ms: its peak while
flooded, and what is left a few seconds after the client has gone. Run
with ``max_held`` at its default and at 1 TiB (no bound: the server reads
every request, as before issue 41).

*Cycles*: ``--cycles`` connect / one message each way / close cycles against
a channel echo server in a child process; the growth of both processes'
resident memory per cycle, with the collector on (and how many full
collections ran) and off. ``--unscoped`` keeps the channels' views of their
regions unscoped, as before issue 41, so they stay mapped until collected.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
from collections.abc import Callable
from typing import Any

import aiordma
from aiordma import rpc
from aiordma.rpc.frames import PROTOCOL, Frame, FrameKind
from aiordma.rpc.server import DEFAULT_MAX_HELD
from aiordma.verbs.memory import MemoryRegion
from benchmarks import lab_address
from benchmarks.peer import StudyPeer, answer, requests

UNBOUNDED = 1 << 40
MIB = 1 << 20


def rss() -> int:
    """This process's resident memory in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def full_collections() -> int:
    return int(gc.get_stats()[2]["collections"])


def keep_views_unscoped() -> Callable[[], None]:
    """Views as before issue 41: kept until collected, so regions stay mapped.
    Returns what undoes it."""
    view = MemoryRegion.view

    def unscoped(self: MemoryRegion, *, scoped: bool = False) -> memoryview:
        return view(self)

    def restore() -> None:
        MemoryRegion.view = view  # type: ignore[method-assign]

    MemoryRegion.view = unscoped  # type: ignore[method-assign]
    return restore


async def serve(host: str, kind: str, max_held: int) -> None:
    """The child: an RPC (``flood``) or channel echo (``cycles``) server that
    answers ``peak`` (and resets it), ``rss`` and ``gc`` on stdin."""
    peak = rss()

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, rss())
            await asyncio.sleep(0.05)

    if kind == "flood":
        service = rpc.Service(max_held=max_held)

        @service.method()
        async def copy(payload: bytes) -> bytes:
            return bytes(payload)

        server = await rpc.start_server(service, host, 0)
    else:

        async def echo(channel: aiordma.MessageChannel) -> None:
            async for message in channel:
                await channel.send_message(message)

        server = await aiordma.start_channel_server(echo, host, 0)
    sampler = asyncio.create_task(sample())
    async for request in requests({"port": server.addresses[0][1]}):
        if request == "peak":
            answer({"peak": max(peak, rss()), "rss": rss()})
            peak = rss()
        elif request == "rss":
            answer({"rss": rss(), "full_collections": full_collections()})
        elif request == "gc-off":
            gc.disable()
            answer({})
    sampler.cancel()
    server.close()
    server.close_clients()
    await server.wait_closed()


async def flood(host: str, size: int, count: int, max_held: int) -> dict[str, Any]:
    child = await StudyPeer.start(__spec__.name, host, "flood", str(max_held))
    try:
        idle = (await child.ask("rss"))["rss"]
        channel = await aiordma.open_channel(
            host, child.hello["port"], protocol=PROTOCOL, max_exposed=size, max_message=size
        )
        body = bytes(size)
        posted: list[asyncio.Future[None]] = []

        async def post_all() -> None:
            for call_id in range(1, count + 1):
                head = Frame(FrameKind.REQUEST, call_id, "copy").pack()
                posted.append(await channel.post_message(body, head=head))

        poster = asyncio.create_task(post_all())
        # Time for the server to read all it will: rxe under TCG moves about 40 MB/s.
        await asyncio.sleep(max(20.0, 2 * count * size / (40 * MIB)))
        flooded = await child.ask("peak")
        poster.cancel()
        channel.close()
        await channel.wait_closed()
        await asyncio.gather(poster, *posted, return_exceptions=True)
        await asyncio.sleep(5)
        after = await child.ask("rss")
    finally:
        await child.stop()
    return {
        "max_held": max_held,
        "idle_mib": idle / MIB,
        "peak_mib": flooded["peak"] / MIB,
        "after_mib": after["rss"] / MIB,
    }


async def cycles(host: str, count: int, collector: bool, unscoped: bool) -> dict[str, Any]:
    argv = ["cycles", "0", *(["--unscoped"] if unscoped else [])]
    child = await StudyPeer.start(__spec__.name, host, *argv)
    restore = keep_views_unscoped() if unscoped else None
    try:
        port = child.hello["port"]

        async def cycle() -> None:
            async with await aiordma.open_channel(host, port) as channel:
                await channel.send_message(bytes(100))
                await channel.recv_message()

        for _ in range(5):  # the device, the loop's completion queue, imports
            await cycle()
        if not collector:
            await child.ask("gc-off")
            gc.disable()
        gc.collect()
        client_before, server_before = rss(), await child.ask("rss")
        collections = full_collections()
        for _ in range(count):
            await cycle()
        client_after, server_after = rss(), await child.ask("rss")
        collections = full_collections() - collections
    finally:
        gc.enable()
        if restore is not None:
            restore()
        await child.stop()
    return {
        "cycles": count,
        "collector": collector,
        "unscoped": unscoped,
        "client_kib_per_cycle": (client_after - client_before) / 1024 / count,
        "server_kib_per_cycle": (server_after["rss"] - server_before["rss"]) / 1024 / count,
        "full_collections": collections
        + server_after["full_collections"]
        - server_before["full_collections"],
    }


def _size(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
    lowered = text.lower()
    for unit, factor in units.items():
        if lowered.endswith(unit):
            return int(lowered.removesuffix(unit)) * factor
    return int(text)


async def study(args: argparse.Namespace) -> list[dict[str, Any]]:
    host = lab_address()
    rows = []
    for max_held in (UNBOUNDED, DEFAULT_MAX_HELD):
        rows.append({"study": "flood", **await flood(host, args.size, args.count, max_held)})
    for unscoped in (True, False):
        for collector in (True, False):
            row = await cycles(host, args.cycles, collector, unscoped)
            rows.append({"study": "cycles", **row})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--size", type=_size, default=16 * MIB, help="bytes per request")
    parser.add_argument("--count", type=int, default=24, help="requests the client floods")
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", nargs=3, metavar="ARG", help=argparse.SUPPRESS)
    parser.add_argument("--unscoped", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.unscoped:
        keep_views_unscoped()
    if args.serve:
        host, kind, max_held = args.serve
        asyncio.run(serve(host, kind, int(max_held)))
        return
    if args.unscoped:
        parser.error("--unscoped is for the server's child; the study runs both")
    rows = asyncio.run(study(args))
    if args.json:
        print(json.dumps(rows))
        return
    for row in rows:
        if row["study"] == "flood":
            held = "unbounded" if row["max_held"] == UNBOUNDED else f"{row['max_held'] // MIB} MiB"
            print(
                f"flood, max_held {held:>9}: server RSS {row['idle_mib']:6.0f} MiB idle, "
                f"{row['peak_mib']:6.0f} MiB at peak, {row['after_mib']:6.0f} MiB after the "
                "client left"
            )
        else:
            views = "unscoped views (before)" if row["unscoped"] else "scoped views"
            gc_state = "collector on " if row["collector"] else "collector off"
            print(
                f"cycles, {views:>23}, {gc_state}: RSS per cycle client "
                f"{row['client_kib_per_cycle']:7.1f} KiB, server "
                f"{row['server_kib_per_cycle']:7.1f} KiB ({row['full_collections']} full "
                f"collections in {row['cycles']} cycles)"
            )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
