"""Bulk transfer: await many RDMA writes and reads into a peer's memory, with progress bars.

    python examples/bulk_transfer.py serve [HOST] [PORT] [--size MIB] [--max-clients N]
    python examples/bulk_transfer.py client HOST PORT [--chunk KIB] [--depth N]

The server registers a buffer for remote reading and writing and hands its
address and rkey to each client in the connection's private data. The
client writes its data into that buffer in chunks, keeping ``--depth``
writes in flight, then tells the server with an RDMA write carrying
immediate data (the byte count), and finally reads everything back to check
it. The server's CPU takes no part in moving the bytes: it only wakes up for
that last immediate.

Run both in the lab:  ./dev test tests/test_examples.py -k bulk
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import sys
import time
from collections.abc import Awaitable, Callable

from tqdm import tqdm

import aiordma
from aiordma import Access, RemoteBuffer


async def serve(host: str | None, port: int, size: int, max_clients: int | None) -> None:
    device = aiordma.Device.shared()
    region = device.alloc(size, Access.REMOTE_READ | Access.REMOTE_WRITE)
    served = 0
    done = asyncio.Event()

    async def prepare(conn: aiordma.Connection) -> asyncio.Future[aiordma.WorkCompletion]:
        # A write with immediate data consumes a receive: post it before the client can write.
        (arrival,) = await conn.post_recv_batch([conn.alloc(1)])
        return arrival

    async def handle(conn: aiordma.Connection) -> None:
        nonlocal served
        arrival: asyncio.Future[aiordma.WorkCompletion] = conn.prepared
        size = (await arrival).imm_data
        assert size is not None
        digest = hashlib.sha256(region.view()[:size]).hexdigest()
        print(f"received {size} bytes, sha256 {digest}", flush=True)
        await conn.wait_closed()  # the client reads the buffer back, then disconnects
        served += 1
        if max_clients is not None and served >= max_clients:
            done.set()

    def accept(request: aiordma.ConnectionRequest) -> bytes:
        return region.remote().to_bytes()

    async with await aiordma.start_server(
        handle, host, port, accept=accept, prepare=prepare, device=device
    ) as server:
        for addr, bound_port in server.addresses:
            print(f"listening on {addr} {bound_port} with {size >> 20} MiB", flush=True)
        if max_clients is None:
            await server.serve_forever()
        else:
            await done.wait()


async def pipelined(
    what: str,
    total: int,
    chunk: int,
    depth: int,
    one: Callable[[int, int], Awaitable[object]],
) -> float:
    """Run ``one(offset, length)`` over ``total`` bytes, ``depth`` at a time; returns seconds."""
    window = asyncio.Semaphore(depth)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=what, file=sys.stderr)

    async def step(offset: int) -> None:
        async with window:
            length = min(chunk, total - offset)
            await one(offset, length)
            bar.update(length)

    start = time.perf_counter()
    with bar:
        async with asyncio.TaskGroup() as group:
            for offset in range(0, total, chunk):
                group.create_task(step(offset))
    return time.perf_counter() - start


async def client(host: str, port: int, chunk: int, depth: int) -> None:
    async with await aiordma.connect(host, port) as conn:
        remote = RemoteBuffer.from_bytes(conn.peer_private_data[: RemoteBuffer.SIZE])
        size = remote.length
        source = conn.register(bytearray(os.urandom(size)))
        back = conn.alloc(size)

        async def write(offset: int, length: int) -> None:
            await conn.rdma_write(
                source[offset : offset + length], remote[offset : offset + length]
            )

        async def read(offset: int, length: int) -> None:
            await conn.rdma_read(back[offset : offset + length], remote[offset : offset + length])

        took = await pipelined("write", size, chunk, depth, write)
        print(f"wrote {size} bytes in {took:.2f} s ({size / took / 1e6:.1f} MB/s)", flush=True)
        await conn.rdma_write(source[:1], remote[:1], imm=size)  # "done": wakes the server
        print(f"sent sha256 {hashlib.sha256(source.view()).hexdigest()}", flush=True)
        took = await pipelined("read", size, chunk, depth, read)
        print(f"read {size} bytes in {took:.2f} s ({size / took / 1e6:.1f} MB/s)", flush=True)
        print("read back intact:", back.view() == source.view(), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    srv = sub.add_parser("serve", help="expose a buffer for clients to fill")
    srv.add_argument("host", nargs="?", default=None, help="address to listen on (default: all)")
    srv.add_argument("port", nargs="?", type=int, default=7473, help="0 picks a free port")
    srv.add_argument("--size", type=int, default=64, help="buffer size in MiB (default 64)")
    srv.add_argument("--max-clients", type=int, help="exit after serving this many clients")
    cli = sub.add_parser("client", help="write the server's buffer, then read it back")
    cli.add_argument("host")
    cli.add_argument("port", type=int)
    cli.add_argument("--chunk", type=int, default=1024, help="KiB per RDMA operation")
    cli.add_argument("--depth", type=int, default=8, help="operations in flight")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        if args.role == "serve":
            asyncio.run(serve(args.host, args.port, args.size << 20, args.max_clients))
        else:
            asyncio.run(client(args.host, args.port, args.chunk << 10, args.depth))
