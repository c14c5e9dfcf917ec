"""An RDMA echo server: every message a client sends comes back to it.

    python examples/echo_server.py [HOST] [PORT] [--max-clients N]

Each connection gets a registered buffer and one receive posted *before* the
client can send (the ``prepare`` hook). The server posts the next receive
before it replies, and the client sends its next message only after the reply,
so a receive is always waiting: no receiver-not-ready retries, ever.

Run it with its client in the lab:  ./dev demo
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

import aiordma

MAX_MESSAGE = 4096


async def prepare(
    conn: aiordma.Connection,
) -> tuple[aiordma.MemoryRegion, asyncio.Future[aiordma.WorkCompletion]]:
    inbox = conn.alloc(MAX_MESSAGE)
    (first,) = await conn.post_recv_batch([inbox])
    return inbox, first


async def echo(conn: aiordma.Connection) -> None:
    host, port = conn.peer_address
    print(f"{host}:{port} connected", flush=True)
    inbox, pending = conn.prepared
    outbox = conn.alloc(MAX_MESSAGE)
    count = 0
    try:
        while True:
            wc = await pending  # ConnectionLostError once the client disconnects
            outbox.view()[: wc.byte_len] = inbox.view()[: wc.byte_len]
            (pending,) = await conn.post_recv_batch([inbox])
            await conn.post_send(outbox[: wc.byte_len])
            count += 1
    except aiordma.ConnectionLostError:
        print(f"{host}:{port} left after {count} messages", flush=True)


async def main(host: str | None, port: int, max_clients: int | None) -> None:
    done = asyncio.Event()
    served = 0

    async def handle(conn: aiordma.Connection) -> None:
        nonlocal served
        await echo(conn)
        served += 1
        if max_clients is not None and served >= max_clients:
            done.set()

    async with await aiordma.start_server(handle, host, port, prepare=prepare) as server:
        for addr, bound_port in server.addresses:
            print(f"listening on {addr} {bound_port}", flush=True)
        if max_clients is None:
            await server.serve_forever()
        else:
            await done.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host", nargs="?", default=None, help="address to listen on (default: all)")
    parser.add_argument("port", nargs="?", type=int, default=7471, help="0 picks a free port")
    parser.add_argument("--max-clients", type=int, help="exit after serving this many clients")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(args.host, args.port, args.max_clients))
