"""What exposing memory to a peer costs: a registration per message, or a window.

    aiordma lab -- python -m benchmarks exposure_cost [--sizes 65536 1048576 ...] [--json]

A large message is exposed for the peer to read, then revoked. Two ways:

- ``register``: register exactly the message's bytes for remote reading,
  and deregister them afterwards (what a message channel does for bytes
  it did not register itself);
- ``window``: bind a memory window over a region registered once with
  ``Access.MW_BIND``, and invalidate it afterwards (no pinning per message).

Each way is first checked once by having the peer RDMA-read the exposed
bytes; then exposing and revoking alone is timed (the window's bind
awaited, as ``bind_window`` does). The read itself is timed too, for scale.

Then the same choice as a message channel makes it: one large message at a
time from a plain region (exposed by registration) or from one registered
with ``Access.MW_BIND`` (exposed by a window whose bind is not awaited: it
runs ahead of the rendezvous on the send queue), each answered by a small
acknowledgement; the median round trip per message.

Prints medians in microseconds, or one JSON line per size with ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import aiordma
from aiordma import Access
from aiordma.bench.stats import Latency
from benchmarks import lab_address

ROUNDS = 30


async def _time(cycle: object, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        await cycle()  # type: ignore[operator]
        samples.append(time.perf_counter() - start)
    return Latency.of(samples).p50


async def measure(size: int, rounds: int) -> dict[str, float | int]:
    async with aiordma.Device() as device:
        owner, peer = await aiordma.connect_loopback_pair(device)
        try:
            source = bytearray(size)
            pool = device.register(source, Access.LOCAL_WRITE | Access.MW_BIND | Access.REMOTE_READ)
            sink = device.alloc(size)

            async def read_only() -> None:
                await peer.rdma_read(sink, pool.remote())

            async def register(check: bool = False) -> None:
                mr = device.register(memoryview(source), Access.REMOTE_READ)
                if check:
                    await peer.rdma_read(sink, mr.remote())
                mr.close()

            async def window(check: bool = False) -> None:
                win = await owner.bind_window(pool, Access.REMOTE_READ)
                if check:
                    await peer.rdma_read(sink, win.remote)
                win.invalidate()

            await register(check=True)
            await window(check=True)
            base = await _time(read_only, rounds)
            reg = await _time(register, rounds)
            win = await _time(window, rounds)
        finally:
            for qp in (owner, peer):
                qp.close()
                await qp.wait_closed()
    plain_msg, window_msg = await _messages(size, max(5, rounds // 3))
    return {
        "size": size,
        "read_us": round(base, 1),
        "register_us": round(reg, 1),
        "window_us": round(win, 1),
        "message_register_us": round(plain_msg, 1),
        "message_window_us": round(window_msg, 1),
    }


async def _messages(size: int, rounds: int) -> tuple[float, float]:
    """Median round trip of a ``size``-byte message and its acknowledgement,
    sent from a plain region and from a bindable one."""

    async def acknowledge(channel: aiordma.MessageChannel) -> None:
        target = channel.conn.alloc(size)
        while True:
            try:
                await channel.recv_message_into(target)
            except aiordma.RdmaError:
                return
            await channel.send_message(b"ok")

    host = lab_address()
    server = await aiordma.start_channel_server(acknowledge, host, 0, max_message=size)
    try:
        port = server.addresses[0][1]
        channel = await aiordma.open_channel(host, port, max_message=size)
        async with channel:
            plain = channel.conn.alloc(size)
            bindable = channel.conn.alloc(size, Access.LOCAL_WRITE | Access.MW_BIND)
            results = []
            for body in (plain, bindable):

                async def one(body: aiordma.MemoryRegion = body) -> None:
                    await channel.send_message(body)
                    await channel.recv_message()

                await one()
                results.append(await _time(one, rounds))
    finally:
        server.close()
        server.close_clients()
        await server.wait_closed()
    return results[0], results[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64 << 10, 1 << 20, 16 << 20])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.json:
        print(
            f"{'size':>10} {'read':>10} {'register':>10} {'window':>10} "
            f"{'msg, registered':>16} {'msg, window':>12}   (us, medians)"
        )
    for size in args.sizes:
        row = asyncio.run(measure(size, args.rounds))
        if args.json:
            print(json.dumps(row))
        else:
            print(
                f"{size:>10} {row['read_us']:>10} {row['register_us']:>10} {row['window_us']:>10} "
                f"{row['message_register_us']:>16} {row['message_window_us']:>12}"
            )


if __name__ == "__main__":
    main()
