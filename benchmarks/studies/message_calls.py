"""Python calls per small message: both ends of a channel in one process, under cProfile.

    aiordma lab -- python -m benchmarks message_calls [--rounds 300] [--size 64] [--rpc] [--top 15]

A channel server echoes and a client ping-pongs ``--rounds`` messages of
``--size`` bytes, both on this process's loop, after a warm-up. cProfile
counts every call it sees (Python functions, and C functions called from
Python); calls per message is that total over ``2 * rounds`` (a round trip
is two messages, and each message's sending and receiving side both run
here). The per-message path (compiled or pure) is the one this process
picked; run it with ``AIORDMA_PURE=1`` for the pure one. With ``--rpc``
the round trip is an RPC call to an ``echo`` method instead (its request
and its reply are the two messages). With ``--verbs`` it is awaited verbs
written as ``aiordma bench send_lat`` and its peer write them (each side
awaits a posted receive, then awaits ``post_send`` of the reply): a
"message" is then one side's share of a round trip, so calls per message is
what one process spends per awaited round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import pstats
from typing import cast

import aiordma
from aiordma import rpc
from aiordma.verbs import per_message_path
from benchmarks import lab_address


async def measure(host: str, rounds: int, size: int) -> pstats.Stats:
    """The profile of ``rounds`` channel round trips."""

    async def echo(channel: aiordma.MessageChannel) -> None:
        async for message in channel:
            await channel.send_message(message)

    payload = bytes(size)
    async with (
        await aiordma.start_channel_server(echo, host, 0) as server,
        await aiordma.open_channel(host, server.addresses[0][1]) as channel,
    ):
        for _ in range(50):  # warm up: first-use paths out of the count
            await channel.send_message(payload)
            await channel.recv_message()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(rounds):
            await channel.send_message(payload)
            await channel.recv_message()
        profile.disable()
    return pstats.Stats(profile)


async def measure_rpc(host: str, rounds: int, size: int) -> pstats.Stats:
    """The profile of ``rounds`` RPC calls to an echo method."""
    service = rpc.Service()

    @service.method()
    async def echo(payload: bytes) -> bytes:
        return payload

    payload = bytes(size)
    async with (
        await rpc.start_server(service, host, 0) as server,
        await rpc.connect(host, server.addresses[0][1]) as client,
    ):
        for _ in range(50):  # warm up: first-use paths out of the count
            await client.call("echo", payload)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(rounds):
            await client.call("echo", payload)
        profile.disable()
    return pstats.Stats(profile)


async def measure_verbs(host: str, rounds: int, size: int) -> pstats.Stats:
    """The profile of ``rounds`` round trips of awaited verbs (both sides here)."""

    async def prepare(conn: aiordma.Connection) -> object:
        inbox = conn.alloc(size)
        return inbox, await conn.post_recv_batch([inbox])

    async def echo(conn: aiordma.Connection) -> None:
        inbox, (pending,) = conn.prepared
        with contextlib.suppress(aiordma.RdmaError):
            while True:
                wc = await pending
                (pending,) = await conn.post_recv_batch([inbox])
                await conn.post_send(inbox[: wc.byte_len])

    async with (
        await aiordma.start_server(echo, host, 0, prepare=prepare) as server,
        await aiordma.connect(host, server.addresses[0][1]) as conn,
    ):
        local, inbox = conn.alloc(size), conn.alloc(size)

        async def ping() -> None:
            (reply,) = await conn.post_recv_batch([inbox])
            await conn.post_send(local)
            await reply

        for _ in range(50):  # warm up: first-use paths out of the count
            await ping()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(rounds):
            await ping()
        profile.disable()
    return pstats.Stats(profile)


def summary(stats: pstats.Stats, rounds: int, size: int, top_n: int = 15) -> dict[str, object]:
    """Calls per message (two per round trip), and the ``top_n`` most called functions."""
    messages = 2 * rounds
    top = sorted(stats.stats.items(), key=lambda item: -item[1][1])[:top_n]  # type: ignore[attr-defined]
    return {
        "path": per_message_path(),
        "size": size,
        "rounds": rounds,
        "calls_per_message": stats.total_calls / messages,  # type: ignore[attr-defined]
        "most_called": [
            {
                "function": f"{file.rsplit('/', 1)[-1]}:{line} {name}",
                "per_message": n / (2 * rounds),
            }
            for (file, line, name), (_, n, *_rest) in top
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="uvloop")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--top", type=int, default=15, help="how many functions to list")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--rpc", action="store_true", help="RPC calls instead of messages")
    kind.add_argument("--verbs", action="store_true", help="awaited verbs instead of messages")
    args = parser.parse_args()
    measure_kind = measure_rpc if args.rpc else measure_verbs if args.verbs else measure
    work = measure_kind(lab_address(), args.rounds, args.size)
    if args.loop == "uvloop":
        import uvloop

        stats = uvloop.run(work)
    else:
        stats = asyncio.run(work)
    row = summary(stats, args.rounds, args.size, args.top)
    if args.json:
        print(json.dumps(row))
        return
    what = "awaited round trip, one side" if args.verbs else "message"
    what = "RPC message" if args.rpc else what
    print(f"{row['path']}: {row['calls_per_message']:.1f} Python calls per {args.size}-byte "
          f"{what} (both sides, {args.rounds} round trips)")  # fmt: skip
    for entry in cast(list[dict[str, object]], row["most_called"]):
        print(f"  {entry['per_message']:6.2f}  {entry['function']}")


if __name__ == "__main__":
    main()
