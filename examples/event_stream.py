"""A stream of small events over a message channel, sent and taken in batches.

    python examples/event_stream.py serve [HOST] [PORT] [--max-clients N]
    python examples/event_stream.py client HOST PORT [--events N] [--batch N]

The client sends events (a few dozen bytes each, as a log or telemetry
shipper would) with ``send_messages``, ``--batch`` a call: the channel packs
neighbours that fit one receive buffer into one packet, so a call costs one
credit and one doorbell, not one per event. The server takes whatever has
arrived with ``recv_messages``, one call for many events. Flow control
needs nothing from either: a server that falls behind holds the client
back, and nothing is dropped. An empty message ends a run; the server
answers it with what it counted and a digest of the events in order.

Run both where there is an RDMA device (``aiordma lab`` gives one): the
server first (it prints ``listening on ADDR PORT``), then the client
against that address and port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import time

import aiordma


async def collect(channel: aiordma.MessageChannel) -> int:
    """Take events until the client leaves, answering each run's end; how many came."""
    total = count = calls = 0
    digest = hashlib.sha256()
    with contextlib.suppress(aiordma.ConnectionLostError, aiordma.ResourceClosedError):
        while True:
            events = await channel.recv_messages()  # at least one; all that has arrived
            calls += 1
            for event in events:
                if event:
                    count += 1
                    digest.update(event)
                    continue
                summary = f"{count} events in {calls} receive calls, sha256 {digest.hexdigest()}"
                await channel.send_message(summary.encode())
                total += count
                count = calls = 0
                digest = hashlib.sha256()
    return total


async def serve(host: str | None, port: int, max_clients: int | None) -> None:
    done = asyncio.Event()
    served = 0

    async def handle(channel: aiordma.MessageChannel) -> None:
        nonlocal served
        host, peer_port = channel.conn.peer_address
        peer = f"{host}:{peer_port}"
        print(f"{peer} left after {await collect(channel)} events", flush=True)
        served += 1
        if max_clients is not None and served >= max_clients:
            done.set()

    async with await aiordma.start_channel_server(handle, host, port) as server:
        for addr, bound_port in server.addresses:
            print(f"listening on {addr} {bound_port}", flush=True)
        if max_clients is None:
            await server.serve_forever()
        else:
            await done.wait()


def event(i: int) -> bytes:
    return b'{"seq": %d, "level": "info", "msg": "request served"}' % i


async def client(host: str, port: int, events: int, batch: int) -> None:
    async with await aiordma.open_channel(host, port) as channel:
        digest = hashlib.sha256()
        start = time.perf_counter()
        for first in range(0, events, batch):
            chunk = [event(i) for i in range(first, min(first + batch, events))]
            for e in chunk:
                digest.update(e)
            await channel.send_messages(chunk)
        await channel.send_message(b"")  # the end of the run
        summary = (await channel.recv_message()).decode()
        took = time.perf_counter() - start
        calls = (events + batch - 1) // batch
        print(f"sent {events} events in {calls} calls ({events / took:,.0f} events/s)", flush=True)
        print(f"server: {summary}", flush=True)
        print(f"digest matches: {summary.endswith(digest.hexdigest())}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    srv = sub.add_parser("serve", help="count and digest the events of each client")
    srv.add_argument("host", nargs="?", default=None, help="address to listen on (default: all)")
    srv.add_argument("port", nargs="?", type=int, default=7473, help="0 picks a free port")
    srv.add_argument("--max-clients", type=int, help="exit after serving this many clients")
    cli = sub.add_parser("client", help="send a run of events in batches")
    cli.add_argument("host")
    cli.add_argument("port", type=int)
    cli.add_argument("--events", type=int, default=10_000, help="how many (default 10000)")
    cli.add_argument("--batch", type=int, default=100, help="events a call (default 100)")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        if args.role == "serve":
            asyncio.run(serve(args.host, args.port, args.max_clients))
        else:
            asyncio.run(client(args.host, args.port, args.events, args.batch))
