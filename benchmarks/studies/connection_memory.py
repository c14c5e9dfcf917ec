"""Memory per connection: what N message-channel connections cost each side.

    aiordma lab -- python -m benchmarks connection_memory [--count 1000] [--shared N] [--json]

Starts a channel server in a child process, opens ``--count`` channels to
it from this process (``--batch`` at a time), sends one message each way on
every channel so both sides are fully set up, then reads both processes'
resident memory (``VmRSS``) and the bytes they have registered. Prints the
increase per connection on each side, next to the registered bytes per
channel that the defaults imply.

With ``--shared N`` each side's channels draw on one
:class:`~aiordma.SharedReceiveQueue` of N buffers, and the queue pairs have
a send depth of 16; the pool (made before the first measurement) is
counted in full, spread over the connections.
"""

from __future__ import annotations

import asyncio
import os

import aiordma
from aiordma.channel.options import DEFAULT_BUFFER, DEFAULT_CONTROL_WINDOW, DEFAULT_WINDOW
from aiordma.verbs.discovery import find_roce_endpoint
from benchmarks import lab_address, printed_json, study_parser
from benchmarks.peer import StudyPeer, answer, requests


def rss() -> int:
    """This process's resident memory in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def registered() -> int:
    """Bytes registered by this process on the shared device."""
    device = aiordma.Device.shared_if_open(find_roce_endpoint().device)  # type: ignore[union-attr]
    return 0 if device is None else device.registered


SHARED_OPTIONS = aiordma.QueuePairOptions(send_depth=16)
"""Queue pairs of channels on a shared pool: a few send slots suffice."""


async def serve(host: str, shared: int) -> None:
    """The child: echo one message per channel; answer ``rss`` on stdin."""

    async def echo(channel: aiordma.MessageChannel) -> None:
        await channel.send_message(await channel.recv_message())
        await channel.conn.wait_closed()

    pool = aiordma.SharedReceiveQueue(buffers=shared) if shared else None
    server = await aiordma.start_channel_server(
        echo, host, 0, backlog=1024, shared_receive=pool,
        options=SHARED_OPTIONS if pool else None,
    )  # fmt: skip
    async for request in requests({"port": server.addresses[0][1], "rss": rss()}):
        if request == "rss":
            answer({"rss": rss(), "registered": registered()})
    server.close()
    server.close_clients()
    await server.wait_closed()
    if pool is not None:
        pool.close()
        await pool.wait_closed()


async def measure(host: str, count: int, batch: int, shared: int) -> dict[str, float]:
    child = await StudyPeer.start(__spec__.name, host, "--shared", str(shared))

    async def ask() -> dict[str, int]:
        return dict(await child.ask("rss"))

    port = child.hello["port"]
    pool = aiordma.SharedReceiveQueue(buffers=shared) if shared else None
    pool_bytes = pool.buffers * pool.buffer_size if pool is not None else 0
    options = SHARED_OPTIONS if pool is not None else None
    # One connection first, so what every process pays once (the device,
    # its completion queue, imports) is not counted per connection.
    warm = await aiordma.open_channel(host, port, shared_receive=pool, options=options)
    await warm.send_message(b"w")
    await warm.recv_message()
    client_before, client_registered_before = rss(), registered()
    server_before = await ask()
    channels: list[aiordma.MessageChannel] = []

    async def one() -> aiordma.MessageChannel:
        channel = await aiordma.open_channel(
            host, port, timeout=60, shared_receive=pool, options=options
        )
        await channel.send_message(b"x")
        await channel.recv_message()
        return channel

    for start in range(0, count, batch):
        channels += await asyncio.gather(*(one() for _ in range(min(batch, count - start))))
    client_after, client_registered_after = rss(), registered()
    server_after = await ask()
    for channel in [warm, *channels]:
        channel.close()
    await asyncio.gather(*(c.wait_closed() for c in [warm, *channels]), return_exceptions=True)
    await child.stop()
    if pool is not None:
        pool.close()
        await pool.wait_closed()
    # Each side's pool was made before its first measurement: count it whole.
    return {
        "connections": count,
        "shared_buffers": shared,
        "client_rss_per_connection": (client_after - client_before + pool_bytes) / count,
        "server_rss_per_connection": (server_after["rss"] - server_before["rss"] + pool_bytes)
        / count,
        "client_registered_per_connection": (
            client_registered_after - client_registered_before + pool_bytes
        )
        / count,
        "server_registered_per_connection": (
            server_after["registered"] - server_before["registered"] + pool_bytes
        )
        / count,
        "default_channel_buffers": 2 * (DEFAULT_WINDOW + DEFAULT_CONTROL_WINDOW) * DEFAULT_BUFFER,
    }


def main() -> None:
    parser = study_parser(__doc__)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument(
        "--shared", type=int, default=0, metavar="N",
        help="channels on each side draw on one shared receive queue of N buffers",
    )  # fmt: skip
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.shared))
        return
    row = asyncio.run(measure(lab_address(), args.count, args.batch, args.shared))
    if printed_json(args, row):
        return
    kib = 1024
    how = f"sharing {args.shared} receive buffers a side" if args.shared else "own buffers"
    print(f"{args.count} connections ({how}), per connection:")
    print(
        f"  client: {row['client_rss_per_connection'] / kib:8.1f} KiB resident, "
        f"{row['client_registered_per_connection'] / kib:8.1f} KiB registered"
    )
    print(
        f"  server: {row['server_rss_per_connection'] / kib:8.1f} KiB resident, "
        f"{row['server_registered_per_connection'] / kib:8.1f} KiB registered"
    )
    print(
        f"  (a channel's send and receive buffers by default: "
        f"{row['default_channel_buffers'] / kib:.0f} KiB)"
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
