"""Large-message throughput by read piece size, on one device.

    aiordma lab -- python -m benchmarks read_pieces [--pieces 65536,262144,1048576]
                                                   [--in-flight 4,8] [--seconds 4]

Both ends in one process, on uvloop, over a connection to this machine's
own address (no wire). For each ``read_piece`` (and, for the RPC, each
count of reads in flight): an RPC method returning 4 MiB into a registered
buffer (``into=``), eight calls in flight; and a channel stream of plain
1 MiB messages (eight posted at once) and of 64 MiB ones (one at a time).
Prints MB/s; run ``aiordma bench read_bw --sizes 4194304 --compare
perftest`` in the same boot for the C reference.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiordma
from aiordma import rpc
from aiordma.channel import sizing
from benchmarks import lab_address


async def rpc_rate(host: str, piece: int, seconds: float, size: int = 4 << 20) -> float:
    """MB/s of ``size``-byte RPC results read in ``piece``-byte pieces."""
    service = rpc.Service()
    blob = bytes(size)

    @service.method()
    async def source(payload: bytes) -> bytes:
        return blob

    async with (
        await rpc.start_server(service, host, 0, read_piece=piece) as server,
        await rpc.connect(host, server.addresses[0][1], read_piece=piece) as client,
    ):
        into = client.conn.alloc(size)
        for _ in range(4):
            await client.call("source", b"", into=into)
        done = 0
        pending: set[asyncio.Future[object]] = set()
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            while len(pending) < 8:
                pending.add(asyncio.ensure_future(client.call("source", b"", into=into)))
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            done += len(finished)
        await asyncio.gather(*pending)
        done += len(pending)
        return done * size / (time.perf_counter() - start) / 1e6


async def message_rate(host: str, piece: int, size: int, depth: int, seconds: float) -> float:
    """MB/s of a stream of ``size``-byte plain messages read in ``piece``-byte pieces."""

    async def sink(channel: aiordma.MessageChannel) -> None:
        async for message in channel:
            if not message:
                await channel.send_message(b"")

    payload = bytes(size)
    async with (
        await aiordma.start_channel_server(sink, host, 0, read_piece=piece) as server,
        await aiordma.open_channel(host, server.addresses[0][1]) as channel,
    ):

        async def stream(seconds: float) -> float:
            done = 0
            pending: list[asyncio.Future[None]] = []
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                if len(pending) >= depth:
                    await pending.pop(0)
                pending.append(await channel.post_message(payload))
                done += 1
            for delivered in pending:
                await delivered
            await channel.send_message(b"")  # answered once the sink has everything
            await channel.recv_message()
            return done * size / (time.perf_counter() - start) / 1e6

        await stream(0.5)
        return await stream(seconds)


async def run(pieces: list[int], in_flight: list[int], seconds: float) -> None:
    host = lab_address()
    for piece in pieces:
        for reads in in_flight:
            sizing.READS_IN_FLIGHT = reads
            rate = await rpc_rate(host, piece, seconds)
            print(f"rpc 4 MiB read_piece {piece >> 10} KiB x{reads}: {rate:.1f} MB/s", flush=True)
    sizing.READS_IN_FLIGHT = 4
    for size, depth in ((1 << 20, 8), (64 << 20, 1)):
        for piece in pieces:
            rate = await message_rate(host, piece, size, depth, seconds)
            print(f"msg {size >> 20} MiB read_piece {piece >> 10} KiB: {rate:.1f} MB/s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--pieces", default="65536,262144,1048576")
    parser.add_argument("--in-flight", default="4,8")
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    import uvloop

    uvloop.run(run([int(p) for p in args.pieces.split(",")],
                   [int(n) for n in args.in_flight.split(",")], args.seconds))  # fmt: skip


if __name__ == "__main__":
    main()
