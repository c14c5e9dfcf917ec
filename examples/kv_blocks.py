"""A block store in the KV-cache pattern: RPC for control, one-sided writes for data.

    python examples/kv_blocks.py serve [HOST] [PORT] [--max-clients N]
    python examples/kv_blocks.py client HOST PORT [--blocks N]

The server owns a pool of fixed-size blocks (registered once). A client asks
for a block over RPC (``lease``); the server answers with where the block is
(a RemoteBuffer: address, length, rkey) and remembers the lease under the
client's connection (``rpc.current_connection()``). The client writes the
block's bytes straight into the server's memory with an RDMA write on the
same connection (``client.conn``), then tells the server over RPC
(``commit``), which checks the block. When a client goes away, its leases
are returned to the pool.

The pool here is registered for remote writing as a whole, which is simple
but lets any client write any block it learns of: a real server gives each
lease a memory window (``Access.MW_BIND``, ``conn.bind_window``) on the
client's own queue pair and invalidates it at commit (see the security
guide).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import struct

import aiordma
from aiordma import Access, rpc

BLOCK = 4096
_COMMIT = struct.Struct("<I32s")  # block number, SHA-256 of its bytes


class BlockStore:
    """The pool, the free list and every client's leases."""

    def __init__(self, blocks: int) -> None:
        self.pool = aiordma.Device.shared().alloc(blocks * BLOCK, Access.REMOTE_WRITE)
        self.free = list(range(blocks))
        self.leases: dict[aiordma.Connection, set[int]] = {}
        self.committed = 0

    def service(self) -> rpc.Service:
        service = rpc.Service()

        @service.method
        async def lease(payload: bytes) -> bytes:
            conn = rpc.current_connection()  # who is asking
            if not self.free:
                raise MemoryError("no free block")
            number = self.free.pop()
            self.leases.setdefault(conn, set()).add(number)
            remote = self.pool.remote(number * BLOCK, BLOCK)
            return struct.pack("<I", number) + remote.to_bytes()

        @service.method
        async def commit(payload: bytes) -> bytes:
            number, digest = _COMMIT.unpack(payload)
            if number not in self.leases.get(rpc.current_connection(), ()):
                raise PermissionError(f"block {number} is not leased to you")
            start = number * BLOCK
            landed = hashlib.sha256(self.pool.view()[start : start + BLOCK]).digest()
            if landed != digest:
                raise ValueError(f"block {number} does not hold what was written")
            self.committed += 1
            return b"ok"

        return service

    def forget(self, conn: aiordma.Connection) -> int:
        """The client is gone: its leases go back to the pool."""
        returned = self.leases.pop(conn, set())
        self.free.extend(returned)
        return len(returned)


async def serve(host: str | None, port: int, max_clients: int | None) -> None:
    store = BlockStore(blocks=256)
    service = store.service()
    done = asyncio.Event()
    served = 0

    async def handle(conn: aiordma.Connection) -> None:
        nonlocal served
        await service.handle(conn)  # until the client disconnects
        returned = store.forget(conn)
        served += 1
        print(f"client left: {returned} leases returned, {store.committed} blocks committed",
              flush=True)  # fmt: skip
        if max_clients is not None and served >= max_clients:
            done.set()

    async with await aiordma.start_server(
        handle, host, port, prepare=aiordma.prepare_channel
    ) as server:
        for addr, bound_port in server.addresses:
            print(f"listening on {addr} {bound_port}", flush=True)
        if max_clients is None:
            await server.serve_forever()
        else:
            await done.wait()


async def client(host: str, port: int, blocks: int) -> None:
    async with await rpc.connect(host, port) as store:
        staging = store.conn.alloc(BLOCK)  # registered once, reused for every block
        for i in range(blocks):
            reply = await store.call("lease")
            (number,) = struct.unpack_from("<I", reply)
            remote = aiordma.RemoteBuffer.from_bytes(reply[4:])
            data = hashlib.sha256(b"%d" % i).digest() * (BLOCK // 32)
            staging.view()[:] = data
            await store.conn.rdma_write(staging, remote)  # one-sided: no server code runs
            await store.call("commit", _COMMIT.pack(number, hashlib.sha256(data).digest()))
        print(f"{blocks} blocks written and committed", flush=True)
        try:
            await store.call("commit", _COMMIT.pack(10_000, bytes(32)))
        except rpc.RemoteError as exc:
            print(f"commit of a block never leased: {exc.remote_type}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    srv = sub.add_parser("serve")
    srv.add_argument("host", nargs="?")
    srv.add_argument("port", nargs="?", type=int, default=7473)
    srv.add_argument("--max-clients", type=int)
    cli = sub.add_parser("client")
    cli.add_argument("host")
    cli.add_argument("port", type=int)
    cli.add_argument("--blocks", type=int, default=16)
    args = parser.parse_args()
    if args.role == "serve":
        asyncio.run(serve(args.host, args.port, args.max_clients))
    else:
        asyncio.run(client(args.host, args.port, args.blocks))


if __name__ == "__main__":
    main()
