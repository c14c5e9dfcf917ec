"""Per-message cost of a shared receive queue: round trip and rate, own buffers vs a pool.

    aiordma lab -- python -m benchmarks shared_receive_speed [--rounds 2] [--count 2000]

A channel server runs in a child process; this process opens one channel
with its own receive buffers and one whose both sides draw on a
:class:`~aiordma.SharedReceiveQueue`, and measures each in turn, ``--rounds``
times alternated: the median round trip of a 64-byte message (echoed), and
how many 64-byte messages per second one side sends to a reader that
counts them.
"""

from __future__ import annotations

import asyncio
import os
import time

import aiordma
from aiordma.bench.stats import Latency
from benchmarks import lab_address, printed_json, study_parser
from benchmarks.peer import StudyPeer, requests

POOL = 1024

SIZE = 64


async def serve(host: str, send_slots: int | None) -> None:
    """The child: one server with own buffers, one on a pool; echo, or count until b"end"."""

    async def handle(channel: aiordma.MessageChannel) -> None:
        mode = await channel.recv_message()
        if mode == b"echo":
            async for message in channel:
                await channel.send_message(message)
        else:
            count = 0
            while await channel.recv_message() != b"end":
                count += 1
            await channel.send_message(b"%d" % count)

    async with (
        aiordma.SharedReceiveQueue(buffers=POOL) as pool,
        await aiordma.start_channel_server(handle, host, 0) as own,
        await aiordma.start_channel_server(
            handle, host, 0, shared_receive=pool, send_slots=send_slots
        ) as shared,
    ):
        ports = {"own": own.addresses[0][1], "shared": shared.addresses[0][1]}
        async for _ in requests(ports):
            pass


async def round_trip(channel: aiordma.MessageChannel, count: int) -> float:
    """Median microseconds of a 64-byte echo."""
    payload = bytes(SIZE)
    times = []
    for _ in range(count):
        start = time.perf_counter()
        await channel.send_message(payload)
        await channel.recv_message()
        times.append(time.perf_counter() - start)
    return Latency.of(times).p50


async def rate(channel: aiordma.MessageChannel, count: int) -> float:
    """64-byte messages per second, from sending the first to the reader's count."""
    payload = bytes(SIZE)
    start = time.perf_counter()
    for _ in range(count):
        await channel.send_message(payload)
    await channel.send_message(b"end")
    got = int(await channel.recv_message())
    elapsed = time.perf_counter() - start
    assert got == count, f"the reader counted {got} of {count}"
    return count / elapsed


async def measure(
    host: str, rounds: int, count: int, send_slots: int | None
) -> list[dict[str, float | str]]:
    slots = ["--send-slots", str(send_slots)] if send_slots else []
    rows: list[dict[str, float | str]] = []
    async with (
        await StudyPeer.start(__spec__.name, host, *slots) as child,
        aiordma.SharedReceiveQueue(buffers=POOL) as pool,
    ):
        ports = child.hello
        for r in range(rounds):
            for kind in ("own", "shared"):
                on = pool if kind == "shared" else None
                own_slots = send_slots if kind == "shared" else None
                echo, sink = [
                    await aiordma.open_channel(
                        host, ports[kind], shared_receive=on, send_slots=own_slots
                    )
                    for _ in range(2)
                ]
                await echo.send_message(b"echo")
                await sink.send_message(b"count")
                await round_trip(echo, count // 10)  # warm up
                lat = await round_trip(echo, count)
                msgs = await rate(sink, count)
                stalls = sink.stats()["counters"].get("credit_stalls", 0)
                rows.append({"round": r + 1, "buffers": kind, "rtt_us": lat,
                             "msg_per_s": msgs, "credit_stalls": stalls})  # fmt: skip
                for channel in (echo, sink):
                    await channel.close()
    return rows


def main() -> None:
    parser = study_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument(
        "--send-slots", type=int, default=None,
        help="send slots of the channels on the pool (default: theirs, 8)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.send_slots))
        return
    rows = asyncio.run(measure(lab_address(), args.rounds, args.count, args.send_slots))
    if printed_json(args, rows):
        return
    print(
        f"{'round':>5} {'buffers':>8} {'64 B round trip (us)':>22} {'64 B msg/s':>12} "
        f"{'credit stalls':>14}"
    )
    for row in rows:
        print(
            f"{row['round']:>5} {row['buffers']:>8} {row['rtt_us']:>22.0f} "
            f"{row['msg_per_s']:>12.0f} {row['credit_stalls']:>14}"
        )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
